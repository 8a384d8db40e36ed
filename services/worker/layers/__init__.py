"""The building blocks the native forwards share: norms, projections, MLPs, rotary embeddings."""

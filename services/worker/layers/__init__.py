"""The building blocks the native forwards share: attention over the KV pool, norms, projections,
MLPs, rotary embeddings, packed and quantized linears, and the elementwise layer steps."""

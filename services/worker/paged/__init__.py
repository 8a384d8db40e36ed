"""The paged engine: a pool of KV blocks per layer, unpadded batches, chunked prefill."""

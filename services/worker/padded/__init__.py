"""The padded engine (TGI's first model server): left-padded batches, each with its own KV cache."""

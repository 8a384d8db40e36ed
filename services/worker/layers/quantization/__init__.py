"""Linear layers over quantized weights: int8 and int4 by torch's kernels, GGUF blocks by ztgi's."""

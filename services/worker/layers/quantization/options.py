"""The `--quantize` choices (`auto`: a GGUF's blocks as stored where they can be served, else float)
and how many rows of a step multiply by int8/int4 weights (above them a packed float copy kept
beside the quantized one is faster): the worker's and the launcher's configs read these, so this
module imports nothing heavy."""

QUANTIZE = ("auto", "none", "gguf", "int8", "int4")
DEFAULT_QUANTIZED_MAX_ROWS = 16  # ztgi's 4-bit block products measured as fast as bfloat16 up to here (BENCHMARKS.md)
FALLBACK_QUANTIZED_MAX_ROWS = 8  # torch's int8/int4 kernels and the Q8_0 lm_head: bfloat16 overtakes them above

"""The model families and their decoders, loading a checkpoint, the dtype it runs in, and what a
model accepts (its requests' limits)."""

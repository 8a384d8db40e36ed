"""ztgi's C kernels (`csrc/`), built for the machine at first start, and their loader and bindings
(docs/kernels.md)."""

"""Tensor-parallel worker groups: one model served by `--num-shard N` rank processes."""

"""`LLM(tensor_parallel_size=N)`: the caller's process is rank 0 of a worker group.

As under `ztgi worker --num-shard N` (docs/shards.md): rank 0 starts ranks 1..N-1 as
`python -m ztgi.services.worker` processes with the engine's worker settings as flags, joins the
collectives with them, loads its share of the model, and relays every command the offline engine
runs to them (`LocalEngine(relay=...)`) before running it itself. The ranks stop when the `LLM`'s
process exits (and die with it if it is killed).
"""

from __future__ import annotations

import atexit

from ztgi.common.config import parse_config
from ztgi.engine_options import EngineOptions
from ztgi.services.worker.backend import Model
from ztgi.services.worker.config import WorkerConfig
from ztgi.services.worker.model_loader import load_model
from ztgi.services.worker.shards.command_relay import CommandRelay
from ztgi.services.worker.shards.shard_group import ShardGroupLost
from ztgi.services.worker.worker_group import GroupLeader


def worker_flags(model: str, dtype: str, device: str, backend: str, options: EngineOptions) -> list[str]:
    """The `ztgi worker` flags that load and step the model as this engine does."""
    flags = ["--model-id", model, "--dtype", dtype, "--device", device, "--backend", backend,
             "--kv-cache", options.kv_cache, "--block-size", str(options.block_size),
             "--step-target-ms", str(options.step_target_ms), "--memory-budget-mb", str(options.memory_budget_mb),
             "--cpu-warmup-prefill-tokens", str(options.cpu_warmup_prefill_tokens or "none"),
             "--speculate", str(options.speculate), "--quantize", options.quantize,
             "--quantized-max-rows", str(options.quantized_max_rows or "none"), "--num-shard", str(options.num_shard)]
    return flags + (["--draft-model-id", options.draft_model_id] if options.draft_model_id else [])


class OfflineGroup:
    """Rank 0's side of the group: started here, its ranks stopped at exit."""

    def __init__(self, model: str, dtype: str, device: str, backend: str, options: EngineOptions) -> None:
        self.flags = worker_flags(model, dtype, device, backend, options)
        self.config = parse_config(WorkerConfig, self.flags, prog="ztgi worker")
        try:
            self.leader = GroupLeader(self.config, self.flags, exit_on_loss=False)
        except ShardGroupLost as exc:
            raise RuntimeError(str(exc)) from None
        atexit.register(self.leader.stop)

    def stop(self) -> None:
        self.leader.stop()

    @property
    def relay(self) -> CommandRelay:
        return self.leader.relay

    def load(self) -> Model:
        """Rank 0's share of the model, once every other rank has loaded its own."""
        config = self.config
        try:
            model = load_model(config.model_id, config.dtype, config.device, config.backend, config.kv_cache,
                               config.block_size, config.quantize, config.speculate,
                               draft_model_id=config.draft_model_id, quantized_max_rows=config.quantized_max_rows,
                               group=self.leader.group)
            self.leader.wait_for_ranks()
        except BaseException as exc:
            self.leader.stop()
            if isinstance(exc, ShardGroupLost):
                raise RuntimeError(str(exc)) from None
            raise
        return model

"""The worker's LoRA adapters: loaded when a request first names one, mixed in every step.

The scheduler registers adapters (checking them against the base model) and sends each request's
`AdapterRef` (name, path, generation); it lets at most --max-loras adapters run on a worker at once.
The worker loads an adapter's tensors when a request first names it and keeps the last
`MAX_LOADED_ADAPTERS` loaded; each step stacks the adapters its rows use (`stacked_adapters.py`),
restacking only when one joins that the stack lacks. The model's four products per layer are
wrapped (`LoraLinear`) when the first adapter is loaded, and add nothing in a step without adapters.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

import torch

from ztgi.common.lora_adapter import AdapterError, check_fits, read_adapter
from ztgi.common.messages import AdapterRef
from ztgi.services.worker.lora.adapter_weights import AdapterWeights, load_adapter_weights
from ztgi.services.worker.lora.lora_linear import Linear, LoraLinear, LoraStep
from ztgi.services.worker.lora.native_lora import NativeLora
from ztgi.services.worker.lora.site_layout import site_layouts
from ztgi.services.worker.lora.stacked_adapters import stack

logger = logging.getLogger(__name__)

MAX_LOADED_ADAPTERS = 32  # adapters kept loaded in the worker's memory, least recently used dropped
NO_RANK_LIMIT = 1 << 20  # the scheduler enforces --max-lora-rank; the worker checks shapes only

AdapterKey = tuple[str, int]  # (name, generation)


class LoraAdapters:
    """Loaded adapters and the current step's stack."""

    def __init__(self, targets: dict[str, list[int]], num_layers: int, dtype: torch.dtype,
                 device: torch.device, attach: Callable[[LoraAdapters], None] | None = None,
                 share: Callable[[AdapterWeights], AdapterWeights] | None = None,
                 local_targets: dict[str, list[int]] | None = None) -> None:
        """`attach` wraps the model's products when the first adapter is loaded (a model that never
        serves one keeps its plain products). A rank of a worker group checks adapters against the
        whole model's `targets`, cuts each to its `share` and stacks them for its own products'
        shapes (`local_targets`)."""
        self.targets = targets
        self._attach = attach
        self._share = share
        local_targets = targets if local_targets is None else local_targets
        self.layouts = site_layouts(local_targets) if local_targets else []
        self.num_layers = num_layers
        self.dtype = dtype
        self.device = device
        self.step = LoraStep()
        self._loaded: collections.OrderedDict[AdapterKey, AdapterWeights] = collections.OrderedDict()
        self._stacked: list[AdapterKey] = []

    def wrap(self, base: Linear, site: str, layer: int) -> LoraLinear:
        """`base`, one of layer `layer`'s products, with the step's adapters added."""
        return LoraLinear(base, self.step, site, layer)

    def require(self, ref: AdapterRef) -> None:
        """Loads the adapter unless it is loaded; ValueError when it cannot be."""
        key = (ref.name, ref.generation)
        if key in self._loaded:
            self._loaded.move_to_end(key)
            return
        try:
            spec = read_adapter(ref.path, NO_RANK_LIMIT)
            check_fits(spec, self.targets, self.num_layers)
            weights = load_adapter_weights(spec, self.dtype)
            if self._share is not None:
                weights = self._share(weights)
        except AdapterError as exc:
            raise ValueError(f"adapter {ref.name!r}: {exc}") from None
        if self._attach is not None:  # the first adapter: the products wrapped, the C kernel built
            self.step.native = NativeLora.load(self.layouts, self.dtype, self.device)
            self._attach(self)
            self._attach = None
        self._loaded[key] = weights
        logger.info("adapter %r loaded from %s (rank %d, %s)", ref.name, ref.path, spec.rank,
                    ", ".join(sorted(spec.targets)))
        self._forget_least_used()

    def _forget_least_used(self) -> None:
        for key in list(self._loaded):
            if len(self._loaded) <= MAX_LOADED_ADAPTERS:
                return
            if key not in self._stacked:
                del self._loaded[key]

    def begin_step(self, row_adapters: list[tuple[AdapterRef | None, int]]) -> None:
        """The step's rows, in order, as (adapter, row count) runs: stacks and masks for them (an
        adapter dropped from the loaded set since its request's Prefill is loaded again)."""
        refs = {(ref.name, ref.generation): ref for ref, _ in row_adapters if ref is not None}
        if not refs:
            self.end_step()
            return
        for ref in refs.values():
            self.require(ref)
        used = list(refs)
        if not set(used) <= set(self._stacked):
            self._restack(used)
        slot_of = {key: slot for slot, key in enumerate(self._stacked, 1)}
        slots = [slot_of[(ref.name, ref.generation)] if ref is not None else 0 for ref, _ in row_adapters]
        row_slots = torch.repeat_interleave(torch.tensor(slots, dtype=torch.int32),
                                            torch.tensor([count for _, count in row_adapters])).to(self.device)
        self.step.row_slots = row_slots
        if self.step.native is None:
            self.step.masks = {name: (row_slots[:, None] == site.column_slots[None, :]).to(self.dtype)
                               for name, site in self.step.sites.items() if site.column_slots is not None}

    def end_step(self) -> None:
        self.step.row_slots = None
        self.step.masks = {}

    def _restack(self, used: list[AdapterKey]) -> None:
        self._stacked = used
        self.step.sites = stack([self._loaded[key] for key in used], self.layouts, self.num_layers, self.dtype,
                                self.device, native=self.step.native is not None)

"""The LoRA adapters requests may name: registered at start (--lora-adapters) or at run time
(LoadAdapter), each checked against the base model's linears before any request uses it.

The scheduler reads only an adapter's config and tensor header (`common/lora_adapter.py`); the
workers load its tensors when a request first names it. Each registration gets a new
`generation`: a name unloaded and loaded again from another path is never taken for the old one,
by a worker's loaded copy or by the prefix cache (whose blocks are keyed by it).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Mapping

from ztgi.common.lora_adapter import AdapterError, AdapterSpec, check_fits, parse_adapter_list, read_adapter
from ztgi.common.messages import AdapterRef, GenerateParameters

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BaseLinears:
    """The base model's adaptable linears (a worker's `WorkerInfo.lora_targets`) and layer count."""

    targets: Mapping[str, list[int]]
    num_layers: int


class AdapterRefusal(Exception):
    """A registry operation refused, with the AdapterReply error type."""

    def __init__(self, message: str, error_type: str) -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type


class AdapterRegistry:
    """Name -> the adapter requests get; `max_rank` is --max-lora-rank."""

    def __init__(self, start_adapters: str | None, max_rank: int) -> None:
        self.max_rank = max_rank
        self._generations = itertools.count(1)
        self._adapters: dict[str, tuple[AdapterRef, AdapterSpec]] = {}
        self._checked_against: BaseLinears | None = None
        for name, path in parse_adapter_list(start_adapters).items():
            try:
                self._add(name, path)
            except AdapterError as exc:
                raise AdapterError(f"--lora-adapters {name}={path}: {exc}") from None

    def names(self) -> list[str]:
        return list(self._adapters)

    def ref(self, name: str) -> AdapterRef | None:
        found = self._adapters.get(name)
        return found[0] if found is not None else None

    def check_base(self, base: BaseLinears) -> None:
        """Every registered adapter against a worker's base model (the start's adapters meet the
        model here, when the first worker registers); AdapterError naming the first that does not fit."""
        if base == self._checked_against:
            return
        for name, (_, spec) in self._adapters.items():
            try:
                check_fits(spec, base.targets, base.num_layers)
            except AdapterError as exc:
                raise AdapterError(f"adapter {name!r}: {exc}") from None
        self._checked_against = base

    def load(self, name: str, path: str, base: BaseLinears | None) -> AdapterRef:
        """Registers `path` under `name`; AdapterRefusal when the name is taken or the adapter does
        not fit the workers' base model."""
        if not name or not path:
            raise AdapterRefusal("lora_name and lora_path must be non-empty", "validation")
        if name in self._adapters:
            raise AdapterRefusal(f"the adapter {name!r} is already loaded (unload it first)", "conflict")
        if base is None:
            raise AdapterRefusal("no worker is ready yet to check the adapter against its model: try again "
                                 "once /health answers 200", "validation")
        try:
            spec = read_adapter(path, self.max_rank)
            check_fits(spec, base.targets, base.num_layers)
        except AdapterError as exc:
            raise AdapterRefusal(str(exc), "validation") from None
        return self._register(name, path, spec)

    def unload(self, name: str, num_using: int) -> None:
        """Forgets `name`; AdapterRefusal when unknown or while `num_using` requests use it."""
        if name not in self._adapters:
            raise AdapterRefusal(f"no adapter is loaded under the name {name!r}", "not_found")
        if num_using:
            raise AdapterRefusal(f"the adapter {name!r} is in use by {num_using} requests: unload it once they "
                                 "finish", "conflict")
        del self._adapters[name]
        logger.info("adapter %r unloaded", name)

    def resolve(self, parameters: GenerateParameters | None) -> AdapterRef | None:
        """The adapter a request asks for: TGI's `adapter_id` (AdapterRefusal when unknown), or
        OpenAI's `model` when an adapter has that name; None for the base model."""
        if parameters is None:
            return None
        if parameters.adapter_id is not None:
            found = self._adapters.get(parameters.adapter_id)
            if found is None:
                known = ", ".join(sorted(self._adapters)) or "none is loaded"
                raise AdapterRefusal(f"adapter_id {parameters.adapter_id!r} is not a loaded adapter ({known})",
                                     "validation")
            return found[0]
        found = self._adapters.get(parameters.model) if parameters.model else None
        return found[0] if found is not None else None

    def _add(self, name: str, path: str) -> None:
        self._register(name, path, read_adapter(path, self.max_rank))

    def _register(self, name: str, path: str, spec: AdapterSpec) -> AdapterRef:
        ref = AdapterRef(name, path, next(self._generations))
        self._adapters[name] = (ref, spec)
        logger.info("adapter %r registered from %s (rank %d, %s)", name, path, spec.rank,
                    ", ".join(sorted(spec.targets)))
        return ref

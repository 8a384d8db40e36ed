"""The start every workload benchmark's `main` shares: its flags, its logging and its prompts."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, TypeVar

from ztgi.bench.offline_workload import load_prompts
from ztgi.bench.workload import Prompt, WorkloadError
from ztgi.common.config import ConfigError, parse_config
from ztgi.common.logs import setup_logging

logger = logging.getLogger(__name__)


class WorkloadConfig(Protocol):
    """A config dataclass naming a workload (`BaselineConfig`, `LlamaCppConfig`)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def dataset(self) -> str: ...

    @property
    def output_tokens(self) -> int | None: ...

    @property
    def max_requests(self) -> int | None: ...

    @property
    def log_level(self) -> str: ...


C = TypeVar("C", bound=WorkloadConfig)


def parse_workload(cls: type[C], argv: Sequence[str] | None, name: str) -> tuple[C, list[Prompt]] | None:
    """The config of `ztgi bench NAME` and its prompts, logging set up; None, with the
    reason logged, for a bad flag or workload (the caller exits with code 2)."""
    try:
        config = parse_config(cls, argv, prog=f"ztgi bench {name}")
        setup_logging(name, config.log_level)
        prompts = load_prompts(config.dataset, config.output_tokens, config.max_requests)
    except (ConfigError, WorkloadError) as exc:
        setup_logging(name)
        logger.error("%s", exc)
        return None
    return config, prompts

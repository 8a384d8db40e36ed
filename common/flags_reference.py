"""docs/flags.md, rendered from the config classes: every command's flags, variables and defaults.

    python -m ztgi.common.flags_reference            # print the page
    python -m ztgi.common.flags_reference --write    # write docs/flags.md

`ztgi.common.config` builds each command's flags and `ZTGI_*` variables from its config fields,
so the page is rendered from the same fields; tests/common/test_flags_reference.py fails when
the page on disk is not what this renders. A new command is one more row in `COMMANDS`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ztgi.common.config import env_name, flag_name

COMMANDS: tuple[tuple[str, str], ...] = (
    ("ztgi launch", "ztgi.services.launcher.config:LaunchConfig"),
    ("ztgi scheduler", "ztgi.services.scheduler.config:SchedulerConfig"),
    ("ztgi tokenizer", "ztgi.services.tokenizer.config:TokenizerConfig"),
    ("ztgi worker", "ztgi.services.worker.config:WorkerConfig"),
    ("ztgi gateway", "ztgi.services.gateway.config:GatewayConfig"),
    ("ztgi bench serve", "ztgi.bench.config:BenchConfig"),
    ("ztgi bench latency", "ztgi.bench.latency:LatencyConfig"),
    ("ztgi bench throughput", "ztgi.bench.offline:OfflineConfig"),
    ("ztgi bench compare", "ztgi.bench.compare:CompareConfig"),
    ("ztgi bench llama-cpp", "ztgi.bench.llama_cpp:LlamaCppConfig"),
    ("ztgi bench static", "ztgi.bench.static_batching:StaticBatchingConfig"),
    ("ztgi bench engine", "ztgi.bench.engine_alone:EngineAloneConfig"),
)
"""(command, "module:ConfigClass"), in the page's order."""

PAGE_PATH = Path(__file__).resolve().parent.parent / "docs" / "flags.md"
REGENERATE = "python -m ztgi.common.flags_reference --write"

HEADER = f"""# Flags

Every flag of every `ztgi` command, generated from the config classes by `{REGENERATE}`
(do not edit this page by hand). Each flag also reads the environment variable beside it; a
flag wins over the variable, the variable over the default. A yes/no flag has a `--no-` form; its
variable takes `1`/`0`, `true`/`false`, `yes`/`no` or `on`/`off`. A default of `none` means unset
(write `none` to unset it again). `ztgi launch` passes the settings the services share to every
child as these variables. Request limits: [limits.md](limits.md).
"""


def config_class(path: str) -> type:
    module_name, _, class_name = path.partition(":")
    cls: type = getattr(importlib.import_module(module_name), class_name)
    return cls


def render() -> str:
    """The whole page."""
    classes = [(command, config_class(path)) for command, path in COMMANDS]
    help_by_name = _shared_help([cls for _, cls in classes])
    sections = [_render_command(command, cls, help_by_name) for command, cls in classes]
    return "\n".join([HEADER, *sections])


def _render_command(command: str, cls: type, help_by_name: dict[str, str]) -> str:
    hints = typing.get_type_hints(cls)
    rows = [_render_row(field, hints[field.name], help_by_name) for field in dataclasses.fields(cls)]
    summary = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].replace("\n", " ")
    return "\n".join([f"## `{command}`", "", summary, "",
                      "| flag | variable | default | meaning |", "|---|---|---|---|", *rows, ""])


def _render_row(field: dataclasses.Field[Any], field_type: Any, help_by_name: dict[str, str]) -> str:
    flag = f"`{flag_name(field.name)}`"
    if _is_bool(field_type):
        flag += f" / `--no-{field.name.replace('_', '-')}`"
    meaning = field.metadata.get("help") or help_by_name.get(field.name, "")
    cells = (flag, f"`{env_name(field.name)}`", _render_default(field.default), _one_line(meaning))
    return "| " + " | ".join(cells) + " |"


def _shared_help(classes: Sequence[type]) -> dict[str, str]:
    """The first help text of each field name, for a command whose same-named field has none
    (`ztgi launch --placement` passes the scheduler's `--placement` on)."""
    help_by_name: dict[str, str] = {}
    for cls in classes:
        for field in dataclasses.fields(cls):
            if field.metadata.get("help"):
                help_by_name.setdefault(field.name, field.metadata["help"])
    return help_by_name


def _is_bool(field_type: Any) -> bool:
    return field_type is bool


def _render_default(default: Any) -> str:
    if default is dataclasses.MISSING:
        return "required"
    if default is None:
        return "`none`"
    if default == "":
        return '`""`'
    return f"`{default}`"


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv not in ([], ["--write"]):
        print(__doc__, file=sys.stderr)
        return 2
    page = render()
    if argv == ["--write"]:
        PAGE_PATH.write_text(page)
        print(f"wrote {PAGE_PATH}", file=sys.stderr)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())

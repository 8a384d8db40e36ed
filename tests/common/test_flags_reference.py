"""docs/flags.md is what `ztgi.common.flags_reference` renders from the config classes today."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ztgi import cli
from ztgi.common import flags_reference

PAGE = Path(__file__).resolve().parents[2] / "docs" / "flags.md"


def test_the_page_is_what_the_generator_renders() -> None:
    """A config field added, renamed or given new help without regenerating the page fails here."""
    assert PAGE.read_text() == flags_reference.render(), (
        f"docs/flags.md is out of date: run `{flags_reference.REGENERATE}`")


def test_every_launch_flag_is_on_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    """What `ztgi launch --help` lists, the page documents (both forms of a yes/no flag)."""
    with pytest.raises(SystemExit):
        cli.main(["launch", "--help"])
    flags = set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", capsys.readouterr().out)) - {"--help"}
    assert "--max-input-tokens" in flags and "--no-prefix-caching" in flags
    page_flags = set(re.findall(r"`(--[a-z0-9-]+)`", PAGE.read_text()))
    assert sorted(flags - page_flags) == []


def test_each_command_has_its_section() -> None:
    page = PAGE.read_text()
    for command, _ in flags_reference.COMMANDS:
        assert f"## `{command}`" in page

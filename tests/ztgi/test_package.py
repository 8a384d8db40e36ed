"""The public surface: what `ztgi` exports, and a command line that stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ztgi
from ztgi.common.client.async_client import AsyncZtgiClient
from ztgi.common.client.sync_client import ZtgiClient


def test_exports() -> None:
    """`from ztgi import ...` gives the offline API, the direct clients and the version."""
    from ztgi import LLM, AsyncClient, Client, RequestOutput, SamplingParams
    from ztgi.llm import LLM as llm_class

    assert (Client, AsyncClient) == (ZtgiClient, AsyncZtgiClient)
    assert (LLM is llm_class and SamplingParams.__name__ == "SamplingParams"
            and RequestOutput.__name__ == "RequestOutput")
    assert ztgi.__version__ and set(ztgi.__all__) <= set(dir(ztgi))
    assert all(getattr(ztgi, name) is not None for name in ztgi.__all__)
    with pytest.raises(AttributeError, match="nothing_here"):
        ztgi.nothing_here  # noqa: B018


def test_command_line_does_not_load_torch() -> None:
    """`ztgi gateway` and friends start through ztgi.cli: importing it (and ztgi) loads no model code."""
    code = "import sys, ztgi, ztgi.cli; print('torch' in sys.modules, 'transformers' in sys.modules)"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert completed.stdout.split() == ["False", "False"], completed.stderr

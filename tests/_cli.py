"""Running the ``ledger`` CLI in-process from tests, and turning params into ``--param`` options."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

__all__ = ["ledger_cli", "param_args"]


def ledger_cli(*args: str) -> Any:
    """``ledger ARGS...`` in this process; the click Result (exceptions propagate)."""
    from ledger._cli import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def param_args(params: dict[str, Any]) -> list[str]:
    """``--param key=JSON`` for each item of ``params``."""
    out: list[str] = []
    for key, value in params.items():
        out += ["--param", f"{key}={json.dumps(value)}"]
    return out

"""Finding and loading experiment files (built-in by name, or a user's path).

An experiment is a Python file of one form (see ``experiments/README.md``):
``NAME`` (optional, the file stem by default), ``PARAMS`` (defaults, every
param it accepts), ``SEED`` (optional default seed), ``async def run(ctx)``,
and optionally ``def check(params)`` that raises ``ValueError`` for a bad
combination and ``def planned(params)`` giving ``{"blocks": n,
"requests_per_block": n, "warmups_per_block": n}`` for progress bars, and
``def plan(params)`` giving measured requests per block by workload and step
and each workload's sizes (registered in ``plan.registered``).

The module is executed from its source text, so a replay runs exactly the
source recorded in ``run.started`` even if the file has changed since.
"""

from __future__ import annotations

import hashlib
import types
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger import ExperimentError

__all__ = ["BUILTIN_DIR", "Experiment", "ExperimentError", "builtin_names", "load", "load_source"]

BUILTIN_DIR = Path(__file__).resolve().parent
_NOT_EXPERIMENTS = frozenset({"commands", "fixtures", "runner", "replay", "__init__", "__main__"})


@dataclass(frozen=True)
class Experiment:
    """A loaded experiment: its module, source text and where it came from."""

    name: str
    source: str
    path: str | None
    module: types.ModuleType

    @property
    def script_sha256(self) -> str:
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

    @property
    def defaults(self) -> Mapping[str, Any]:
        return dict(getattr(self.module, "PARAMS", {}))

    @property
    def default_seed(self) -> int | None:
        seed = getattr(self.module, "SEED", None)
        return seed if isinstance(seed, int) else None

    @property
    def run(self) -> Callable[[Any], Awaitable[None]]:
        fn: Callable[[Any], Awaitable[None]] = self.module.run
        return fn

    def check(self, params: Mapping[str, Any]) -> None:
        """The experiment's own parameter check (raises ValueError)."""
        fn = getattr(self.module, "check", None)
        if fn is not None:
            fn(dict(params))

    def planned(self, params: Mapping[str, Any]) -> dict[str, int]:
        fn = getattr(self.module, "planned", None)
        return dict(fn(dict(params))) if fn is not None else {}

    def plan(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``{"requests": {workload: {step: n}}, "sizes": {workload: [tokens]}}`` per block, or {}."""
        fn = getattr(self.module, "plan", None)
        return dict(fn(dict(params))) if fn is not None else {}


def builtin_names() -> list[str]:
    """Experiments shipped in ``experiments/`` (files defining ``run``)."""
    names = []
    for path in sorted(BUILTIN_DIR.glob("*.py")):
        if path.stem.startswith("_") or path.stem in _NOT_EXPERIMENTS:
            continue
        if "async def run(" in path.read_text(encoding="utf-8"):
            names.append(path.stem)
    return names


def load_source(source: str, *, name: str, path: str | None = None) -> Experiment:
    """Execute ``source`` as a fresh module and check it has the experiment form."""
    module = types.ModuleType(f"kvledger_experiment_{name.replace('-', '_')}")
    module.__file__ = path or f"<experiment {name}>"
    try:
        code = compile(source, module.__file__, "exec")
        exec(code, module.__dict__)
    except SyntaxError as exc:
        raise ExperimentError(f"experiment {name}: {exc}") from exc
    run = getattr(module, "run", None)
    if run is None or not callable(run):
        raise ExperimentError(f"experiment {name} defines no `async def run(ctx)`")
    params = getattr(module, "PARAMS", {})
    if not isinstance(params, dict):
        raise ExperimentError(f"experiment {name}: PARAMS must be a dict")
    return Experiment(str(getattr(module, "NAME", name)), source, path, module)


def load(ref: str) -> Experiment:
    """A built-in by name (``screening``) or a file path (``./my_experiment.py``)."""
    candidate = Path(ref)
    if ref.endswith(".py") or candidate.parent != Path("."):
        if not candidate.is_file():
            raise ExperimentError(f"no experiment file {ref}")
        path = candidate.resolve()
        return load_source(path.read_text(encoding="utf-8"), name=path.stem, path=str(path))
    if ref in builtin_names():
        path = BUILTIN_DIR / f"{ref}.py"
        return load_source(path.read_text(encoding="utf-8"), name=ref, path=str(path))
    raise ExperimentError(
        f"unknown experiment {ref!r}; built-in: {', '.join(builtin_names())} (or give a path to a .py file)"
    )

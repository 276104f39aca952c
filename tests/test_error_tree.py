"""One error tree: every exception class the ``ledger`` command can raise derives from LedgerError.

The classes are found, not listed: from the commands the CLI names (``ledger._cli.LAZY_COMMANDS``)
the project modules they import are followed, statically and transitively (imports inside
functions and module names written as strings too), and every exception class those modules
define is checked. A few are signals that never leave the code that raises them; each is
named below with the reason, and must be caught somewhere by name.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from ledger import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, LedgerError
from ledger._cli import LAZY_COMMANDS

ROOT = Path(__file__).resolve().parents[1]
_PACKAGES = ("ledger", "collectors", "experiments", "reports")
_MODULE_STRING = re.compile(rf"^(?:{'|'.join(_PACKAGES)})(?:\.\w+)+(?::\w+)?$")

# Raised and caught inside one component; none reaches a command's caller.
INTERNAL = {
    "experiments.targets.sim._protocol.ApiError": "the sim answers it as vLLM's HTTP error body",
    "experiments._context.BlockFailed": "the runner records the block as failed and goes on",
    "collectors._metrics.MetricsError": "a failed scrape is recorded as such where it happens",
    "ledger._store._PlainPath": "a batch sealed in parts goes the plain way: caught where it is raised",
}


def _source(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    origin = spec.origin if spec is not None else None
    return Path(origin) if origin and origin.endswith(".py") else None


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _imported(module: str, tree: ast.AST, is_package: bool) -> set[str]:
    """Project modules ``tree`` imports anywhere, or names in a string, with their parents."""
    found: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and _MODULE_STRING.match(str(node.value)):
            names = [str(node.value).split(":")[0]]
        for name in names:
            if name.split(".")[0] in _PACKAGES and _is_module(name):
                parts = name.split(".")
                found.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    return found


def _reachable() -> tuple[set[str], dict[str, ast.AST]]:
    """Project modules the CLI can import, and their syntax trees."""
    todo = {"ledger._cli", *(entry.split(":")[0] for entry, _ in LAZY_COMMANDS.values())}
    seen: set[str] = set()
    trees: dict[str, ast.AST] = {}
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _source(module)
        if path is None:
            continue
        trees[module] = tree = ast.parse(path.read_text(), str(path))
        todo |= _imported(module, tree, path.name == "__init__.py") - seen
    return seen, trees


def _exception_classes(modules: set[str]) -> dict[str, type[BaseException]]:
    classes: dict[str, type[BaseException]] = {}
    for module in sorted(modules):
        if module.endswith("__main__"):
            continue  # a script: imported, it would run (its exceptions are in the modules it uses)
        mod = importlib.import_module(module)
        for value in vars(mod).values():
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == module:
                classes[f"{module}.{value.__qualname__}"] = value
    return classes


def _caught_by_name(trees: dict[str, ast.AST]) -> set[str]:
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                types = node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]
                names |= {t.id if isinstance(t, ast.Name) else ast.unparse(t) for t in types}
    return names


def test_every_exception_the_cli_can_raise_derives_from_the_root() -> None:
    modules, trees = _reachable()
    classes = _exception_classes(modules)
    # The walk reaches the far ends of the CLI: the vllm target's engine builder and launcher.
    for name in (
        "experiments.targets.vllm.engines.EngineError",
        "experiments.targets.vllm._process.StartupError",
        "collectors._imports.ResultFileError",
        "ledger._errors.TargetError",
        *INTERNAL,
    ):
        assert name in classes, (name, sorted(classes))
    outside = sorted(n for n, c in classes.items() if not issubclass(c, LedgerError) and n not in INTERNAL)
    assert not outside, f"outside the LedgerError tree: {outside}"
    statuses = {n: c.exit_status for n, c in classes.items() if issubclass(c, LedgerError)}
    assert set(statuses.values()) <= {EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT}, statuses
    caught = _caught_by_name(trees)
    assert {n.rsplit(".", 1)[1] for n in INTERNAL} <= caught


def test_engine_and_startup_errors_are_target_errors_with_their_exit_status() -> None:
    from experiments.targets.vllm._process import StartupError
    from experiments.targets.vllm.engines import EngineError
    from ledger import TargetError

    for cls in (EngineError, StartupError):
        assert issubclass(cls, TargetError)
        assert cls("x").exit_status == EXIT_BAD_INPUT


def test_import_ledger_loads_no_store() -> None:
    """``import ledger`` (and the error tree through it) costs no database or analytics import:
    the standard-library-only modules that derive their errors from it stay fast."""
    heavy = ("sqlalchemy", "duckdb", "pyarrow", "numpy", "alembic", "click")
    code = (
        "import sys, ledger, ledger._errors, experiments.targets.vllm.engines; "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    import ledger

    for name in ledger.__all__:  # every public name still resolves, on first use
        assert getattr(ledger, name) is not None, name

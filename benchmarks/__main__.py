"""``python -m benchmarks NAME [ARGS...]``: run ``benchmarks.<NAME>.main()``.

Any module in this package with a ``main()`` is a benchmark; each prints its
figures and then, as its last line, one JSON object.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def available() -> list[str]:
    """Benchmark modules in this package (private helpers start with ``_``)."""
    return sorted(
        m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if not m.name.startswith("_")
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m benchmarks NAME [ARGS...]\nbenchmarks: " + ", ".join(available()))
        return 0 if args else 2
    name = args[0].replace("-", "_")  # gpu-screening runs gpu_screening, helper-probes helper_probes
    if name.startswith("_") or name not in available():
        print(f"unknown benchmark {name!r}; available: {', '.join(available())}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"benchmarks.{name}")
    sys.argv = [f"benchmarks {name}", *args[1:]]
    result = module.main()
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())

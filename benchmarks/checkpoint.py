"""Checkpoint audit throughput against openssl and sha256sum on the same data.

`python -m benchmarks checkpoint`: one 2 GiB file, then four 512 MiB files,
page cache warm. Prints figures, then a last line of JSON with
`ratio_to_openssl`, `ratio_parallel_to_openssl`, `ratio_to_sha256sum`.
Goal: >= 0.95x openssl on one file, >= 1.6x with four files on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from collectors._checkpoint import audit_checkpoint

GIB = 1 << 30


def _write(path: Path, size: int) -> None:
    block = os.urandom(16 << 20)
    with open(path, "wb") as out:
        for _ in range(size // len(block)):
            out.write(block[::-1] if out.tell() % 3 else block)


def _best(fn: Callable[[], object], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _tool(argv: list[str]) -> Callable[[], object]:
    return lambda: subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def _measure(directory: Path, files: list[Path]) -> dict[str, float]:
    names = [str(f) for f in files]
    ours = _best(lambda: audit_checkpoint(directory))
    openssl = _best(lambda: [_tool(["openssl", "dgst", "-sha256", n])() for n in names])
    sha256sum = _best(_tool(["sha256sum", *names]), repeats=1) if shutil.which("sha256sum") else float("nan")
    total = sum(f.stat().st_size for f in files)
    return {
        "ours_s": ours,
        "openssl_s": openssl,
        "sha256sum_s": sha256sum,
        "ours_gb_s": total / ours / 1e9,
        "openssl_gb_s": total / openssl / 1e9,
    }


def main() -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("KVLEDGER_BENCH_DIR")) as tmp:
        one, four = Path(tmp, "one"), Path(tmp, "four")
        one.mkdir()
        four.mkdir()
        _write(one / "model.safetensors", 2 * GIB)
        parts = [four / f"model-{i:05d}.safetensors" for i in range(4)]
        for part in parts:
            _write(part, GIB // 2)
        single = _measure(one, [one / "model.safetensors"])
        multi = _measure(four, parts)
    result = {
        "ratio_to_openssl": round(single["openssl_s"] / single["ours_s"], 3),
        "ratio_parallel_to_openssl": round(multi["openssl_s"] / multi["ours_s"], 3),
        "ratio_to_sha256sum": round(single["sha256sum_s"] / single["ours_s"], 3),
        "one_file": {k: round(v, 3) for k, v in single.items()},
        "four_files": {k: round(v, 3) for k, v in multi.items()},
        "cpus": os.cpu_count(),
    }
    print(
        f"one 2 GiB file: kvledger {single['ours_s']:.3f}s ({single['ours_gb_s']:.2f} GB/s), "
        f"openssl {single['openssl_s']:.3f}s, sha256sum {single['sha256sum_s']:.3f}s "
        f"-> {result['ratio_to_openssl']}x openssl (goal >= 0.95)"
    )
    print(
        f"four 512 MiB files: kvledger {multi['ours_s']:.3f}s in parallel, openssl one after "
        f"another {multi['openssl_s']:.3f}s -> {result['ratio_parallel_to_openssl']}x (goal >= 1.6)"
    )
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()

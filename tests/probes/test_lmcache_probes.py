"""The LMCache helper and pool probes without a GPU: their matrix, settings and event shapes.

What the checks measure needs CUDA and LMCache (tests/probes/test_helper_data.py
reads the records of a GPU run); here: the plan each probe runs, the event data
it builds from a child's rows (including rows a crashed child never wrote),
that every event passes the ledger's vocabulary, and the usage errors.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from collectors.probes import lmcache_helpers as helpers
from collectors.probes import lmcache_pool as pool
from collectors.probes._envelope import envelope
from ledger._vocabulary import check_data

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
GIB = 1 << 30


def test_helper_matrix_covers_every_cell_with_five_checks_per_direction() -> None:
    config = helpers.HelperProbeConfig()
    cells = config.cells()
    assert MIB in config.sizes and config.trials >= 5
    keys = [helpers.cell_key(c) for c in cells]
    assert len(set(keys)) == len(keys)
    expected = set(
        itertools.product(
            ("lazy", "mixed"), config.sizes, ("d2h", "h2d"), config.delays, range(config.trials)
        )
    )
    assert set(keys) == expected
    assert 0 in config.delays and any(d > 0 for d in config.delays)
    assert config.params()["checks_per_process"] == len(cells)


@pytest.mark.parametrize(
    "kwargs",
    [{"allocators": ("teleport",)}, {"ops_modes": ("maybe",)}, {"trials": 0}, {"sizes": (128 * MIB,)}],
)
def test_helper_config_refuses_bad_values(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        helpers.HelperProbeConfig(**kwargs)


def test_helper_cli_usage_error_exits_2_before_cuda(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "o.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "collectors.probes",
            "helper-probes",
            "--jsonl",
            str(out),
            "--allocators",
            "lazy,teleport",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "unknown or no allocator(s) ['teleport']" in proc.stderr
    assert not out.exists()


def _child_rows(config: helpers.HelperProbeConfig, crash_after: int) -> list[dict[str, Any]]:
    """Rows as a child writes them: its facts, then checks; it 'crashes' after ``crash_after``."""
    facts = {
        "type": "process",
        "pid": 4242,
        "torch_version": "2.11.0+cu130",
        "cuda_runtime_version": "13.0",
        "gpu": {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-0"},
        "lmcache": {
            "version": "0.5.3",
            "with_ops": False,
            "source_sha256": "ab" * 32,
            "copy_lib": "libcudart.so.13",
            "copy_lib_injected": True,
        },
    }
    rows: list[dict[str, Any]] = [facts]
    for i, cell in enumerate(config.cells()[:crash_after]):
        bad = cell["allocator"] == "lazy" and cell["delay_cycles"] > 0
        rows.append(
            {
                "type": "check",
                **cell,
                "helper": helpers.HELPERS[cell["direction"]],
                "copy": helpers.COPY_RAW if cell["allocator"] == "lazy" else helpers.COPY_TENSOR,
                "mismatching_bytes": cell["bytes"] if bad else 0,
                "first_bad_offset": 0 if bad else None,
                "copy_landed_bad_bytes": 0,
                "error": "boom" if i == 3 else None,
                "ts": "2026-12-01T00:00:00.000000Z",
            }
        )
    return rows


def test_event_data_judges_each_check_and_passes_the_vocabulary() -> None:
    config = helpers.HelperProbeConfig(sizes=(4096, MIB), trials=5)
    rows = _child_rows(config, crash_after=len(config.cells()))
    base = {
        "ops_requested": "masked",
        "driver_version": "580",
        "lmcache_version": "0.5.3",
        "torch_version": "2.11.0+cu130",
        "gpu": {"index": 0},
    }
    facts = rows[0]
    events = [envelope(helpers.KIND, helpers._event_data(r, facts, base), "run") for r in rows[1:]]
    for e in events:
        assert check_data(helpers.KIND, e["data"]) is None, e["data"]
    data = [e["data"] for e in events]
    assert sum(1 for d in data if d["error"]) == 1
    errored = next(d for d in data if d["error"])
    assert errored["passed"] is False
    lazy_delayed = [d for d in data if d["allocator"] == "lazy" and d["delay_cycles"] and not d["error"]]
    assert lazy_delayed and not any(d["passed"] for d in lazy_delayed)
    assert all(d["first_bad_offset"] == 0 for d in lazy_delayed)
    mixed = [d for d in data if d["allocator"] == "mixed" and not d["error"]]
    assert mixed and all(d["passed"] for d in mixed)
    assert {d["lmcache_version"] for d in data} == {"0.5.3"}
    assert {d["gpu"]["uuid"] for d in data} == {"GPU-0"}
    table = helpers.summarize(events)
    assert table["lazy|no-ops|d2h|delayed"] == {"passed": 0, "failed": 10, "errored": 0}
    assert sum(r["errored"] for r in table.values()) == 1
    assert "lazy" in helpers.format_summary(table)


def test_unrun_checks_of_a_crashed_child_are_recorded_as_errors() -> None:
    # run_helper_probes fills every planned cell the child never wrote with an errored check.
    config = helpers.HelperProbeConfig(sizes=(MIB,), trials=5)
    rows = _child_rows(config, crash_after=7)
    done = {helpers.cell_key(r) for r in rows if r.get("type") == "check"}
    missing = [c for c in config.cells() if helpers.cell_key(c) not in done]
    base = {
        "ops_requested": "masked",
        "driver_version": None,
        "lmcache_version": "0.5.3",
        "torch_version": "2.11.0",
        "gpu": {"index": 0},
    }
    filled = [
        helpers._event_data(
            {**c, "helper": helpers.HELPERS[c["direction"]], "error": "worker exited -11 before this check"},
            rows[0],
            base,
        )
        for c in missing
    ]
    assert len(filled) + len(done) == len(config.cells())
    assert all(d["passed"] is False and d["mismatching_bytes"] is None for d in filled)
    assert all(check_data(helpers.KIND, d) is None for d in filled)


def test_pool_sizes_are_exact_lmcache_settings() -> None:
    for n in pool.SIZES:
        text = pool.gb_setting(n)
        assert int(float(text) * 1024**3) == n  # what LMCache computes from max_local_cpu_size
    assert float(pool.gb_setting(GIB + 4096)) == 1 + 2**-18
    with pytest.raises(ValueError):
        pool.gb_setting((1 << 60) + 1)  # beyond a double's 53 bits


def test_pool_settings_plan() -> None:
    config = pool.PoolProbeConfig()
    settings = config.settings()
    unmitigated = [s for s in settings if s["alloc_conf"] is None]
    assert [s["ops"] for s in unmitigated] == ["present", "masked"]
    assert all(s["sizes"] == sorted(pool.SIZES) for s in unmitigated)
    mitigated = [s for s in settings if s["alloc_conf"] is not None]
    assert {s["alloc_conf"] for s in mitigated} == set(pool.MITIGATIONS)
    assert all(s["ops"] == "masked" and max(s["sizes"]) <= config.mitigate_up_to for s in mitigated)
    assert "pinned_max_round_threshold_mb:128" in pool.MITIGATIONS  # refused by torch 2.11: an observation
    with pytest.raises(ValueError):
        pool.PoolProbeConfig(ops_modes=("sometimes",))


def test_pool_event_data_passes_the_vocabulary() -> None:
    lm = {"version": "0.5.3", "with_ops": False, "source_sha256": "cd" * 32}
    row = {
        "type": "pool",
        "bytes_requested": GIB + 4096,
        "bytes_reserved": 2 * GIB,
        "is_pinned": True,
        "seconds": 0.8,
        "error": None,
        "failed_at": None,
        "allocator": "MixedMemoryAllocator",
        "ts": "2026-12-01T00:00:00.000000Z",
    }
    context = ({"pid": 1}, {"version": "0.5.3"}, "2.11", None)
    data = pool._event_data(row, lm, "masked", None, None, None, *context)
    assert check_data(pool.KIND, data) is None, data
    assert data["setting"]["LMCACHE_MAX_LOCAL_CPU_SIZE"] == pool.gb_setting(GIB + 4096)
    refused = {
        "type": "pool",
        "bytes_requested": GIB,
        "is_pinned": False,
        "bytes_reserved": None,
        "seconds": 0.0003,
        "error": "ValueError: Unrecognized key",
        "failed_at": "cuda-init",
    }
    conf = "pinned_max_round_threshold_mb:128"
    data = pool._event_data(refused, {}, "masked", conf, "PYTORCH_CUDA_ALLOC_CONF", conf, *context)
    assert check_data(pool.KIND, data) is None, data
    assert data["alloc_conf"] == f"PYTORCH_CUDA_ALLOC_CONF={conf}" and data["with_ops"] is None

"""The committed LMCache helper and pool records: counts per cell, the pass/fail pattern, the pool's rounding.

They read tests/data/probes/helper_probes.jsonl and pinned_pool.jsonl, as
``bash scripts/gpu-probes`` wrote them on two H200s (README.md there says where
and when). Counts are derived from the run's own params; where an assertion
encodes what the GPUs did rather than what LMCache's code implies, its message
says so.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from collectors.probes.lmcache_helpers import COPY_NATIVE, COPY_RAW, COPY_TENSOR, HELPERS, summarize
from collectors.probes.pinned_alloc import next_power_of_two
from ledger._vocabulary import check_data
from reports._validation import judge_pinned, within_tolerance

DATA = Path(__file__).resolve().parents[1] / "data" / "probes"
HEX64 = re.compile(r"^[0-9a-f]{64}$")
GIB = 1 << 30
PAGE = 4096
REFUSED_KEY = "pinned_max_round_threshold_mb"


def load(name: str) -> list[dict[str, Any]]:
    path = DATA / name
    assert path.exists(), f"the recorded GPU probe run {path} is missing"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def helper_run() -> list[dict[str, Any]]:
    return load("helper_probes.jsonl")


@pytest.fixture(scope="module")
def pool_run() -> list[dict[str, Any]]:
    return load("pinned_pool.jsonl")


def checks_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["kind"] == "probe.helper"]


def pools_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["kind"] == "probe.pinned"]


def raw_fallback_delayed(d: dict[str, Any]) -> bool:
    """The seed's failing path: lazy allocator, no compiled ops (stream-less cudaMemcpy), delayed producer."""
    return d["allocator"] == "lazy" and d["with_ops"] is False and d["delay_cycles"] > 0


# --------------------------------------------------------------------------------------------
# helper checks


def test_helper_run_shape(helper_run: list[dict[str, Any]]) -> None:
    events = helper_run
    assert events[0]["kind"] == "run.started" and events[-1]["kind"] == "run.finished"
    assert len({e["run_id"] for e in events}) == 1
    finished = events[-1]["data"]
    assert finished["status"] == "completed" and finished["errored_checks"] == 0
    checks = checks_of(events)
    assert finished["checks"] == len(checks) == len(events) - 2
    for d in checks:
        assert check_data("probe.helper", d) is None, d
        assert d["helper"] == HELPERS[d["direction"]]
        assert d["passed"] == (
            d["error"] is None and d["mismatching_bytes"] == 0 and d["copy_landed_bad_bytes"] == 0
        ), d
        assert d["host_pinned"] is True and d["transfer_path"] == "gpu"
    assert not [d for d in checks if d["error"]], "errored checks"
    # One LMCache (version and source), one torch and CUDA runtime, every GPU of the host.
    started = events[0]["data"]
    assert {d["lmcache_version"] for d in checks} == {started["lmcache"]["version"]}
    (digest,) = {d["lmcache_source_sha256"] for d in checks}
    assert HEX64.match(digest)
    assert {d["torch_version"] for d in checks} == {"2.11.0+cu130"}
    assert {d["cuda_runtime_version"] for d in checks} == {started["packages"]["torch.version.cuda"]}
    host_gpus = {g["uuid"] for g in started["host"]["gpus"]}
    assert {d["gpu"]["uuid"] for d in checks} == host_gpus and len(host_gpus) == 2
    assert finished["summary"] == summarize(events)  # the printed table is the events' own


def test_every_cell_has_its_checks(helper_run: list[dict[str, Any]]) -> None:
    params = helper_run[0]["data"]["params"]
    trials = params["trials"]
    assert trials >= 5 and (1 << 20) in params["sizes"]
    cells = Counter(
        (d["gpu"]["uuid"], d["ops_requested"], d["allocator"], d["bytes"], d["direction"], d["delay_cycles"])
        for d in checks_of(helper_run)
    )
    gpus = {key[0] for key in cells}
    assert len(gpus) == len(params["devices_run"])
    expected = (
        len(gpus)
        * len(params["ops_modes"])
        * len(params["allocators"])
        * len(params["sizes"])
        * len(params["directions"])
        * len(params["delays"])
    )
    assert len(cells) == expected
    assert set(cells.values()) == {trials}
    per_process = Counter((d["gpu"]["uuid"], d["ops_requested"]) for d in checks_of(helper_run))
    assert set(per_process.values()) == {params["checks_per_process"]}


def test_ops_states_and_copy_branches(helper_run: list[dict[str, Any]]) -> None:
    checks = checks_of(helper_run)
    assert {(d["ops_requested"], d["with_ops"]) for d in checks} == {("present", True), ("masked", False)}
    for d in checks:
        expected = COPY_TENSOR if d["allocator"] == "mixed" else (COPY_NATIVE if d["with_ops"] else COPY_RAW)
        assert d["copy"] == expected, d
    # LMCache's own lookup found the CUDA runtime: the fallback copied through it, nothing injected.
    masked = [d for d in checks if d["with_ops"] is False]
    assert {d["lmcache_copy_lib_injected"] for d in masked} == {False}
    assert all("cudart" in (d["lmcache_copy_lib"] or "") for d in masked)


def test_pass_fail_pattern(helper_run: list[dict[str, Any]]) -> None:
    """Only the lazy allocator's stream-less fallback fails, and only when the producer is delayed."""
    params = helper_run[0]["data"]["params"]
    paths: dict[tuple[Any, ...], Counter[str]] = defaultdict(Counter)
    for d in checks_of(helper_run):
        key = (d["gpu"]["uuid"], d["allocator"], d["with_ops"], d["direction"], d["delay_cycles"] > 0)
        paths[key]["passed" if d["passed"] else "failed"] += 1
    per_path = len(params["sizes"]) * params["trials"]
    assert len(paths) == len(params["devices_run"]) * 2 * 2 * 2 * 2
    for (gpu, allocator, with_ops, direction, delayed), counts in paths.items():
        failing = allocator == "lazy" and with_ops is False and delayed
        expected = Counter({"failed": per_path}) if failing else Counter({"passed": per_path})
        assert counts == expected, (
            f"{gpu} {allocator} ops={with_ops} {direction} delayed={delayed}: {dict(counts)}; recorded on "
            "two H200s: the raw fallback failed every delayed check and passed every undelayed one, "
            "every other path passed every check"
        )


def test_seed_cells_at_one_mebibyte(helper_run: list[dict[str, Any]]) -> None:
    """The seed's 1 MiB object: lazy path 10 of 10 failed on GPU 0, mixed 10 passed on each GPU."""
    trials = helper_run[0]["data"]["params"]["trials"]
    # The seed's image had no compiled ops: the masked runs, delayed producer.
    mib = [
        d
        for d in checks_of(helper_run)
        if d["bytes"] == 1 << 20 and d["delay_cycles"] > 0 and d["with_ops"] is False
    ]
    for gpu in {d["gpu"]["uuid"] for d in mib}:
        lazy = [d for d in mib if d["gpu"]["uuid"] == gpu and d["allocator"] == "lazy"]
        mixed = [d for d in mib if d["gpu"]["uuid"] == gpu and d["allocator"] == "mixed"]
        assert len(lazy) == len(mixed) == 2 * trials
        assert not any(d["passed"] for d in lazy), gpu
        assert all(d["passed"] for d in mixed), gpu


def test_first_bad_bytes(helper_run: list[dict[str, Any]]) -> None:
    """A failed check mismatches the whole object from offset 0; the direction says which buffer."""
    checks = checks_of(helper_run)
    failed = [d for d in checks if not d["passed"]]
    assert failed and all(raw_fallback_delayed(d) for d in failed)
    for d in failed:
        assert d["first_bad_offset"] == 0 and d["mismatching_bytes"] == d["bytes"], d
        if d["direction"] == "d2h":  # the copy ran before the delayed producer wrote: stale bytes landed
            assert d["copy_landed_bad_bytes"] == d["bytes"], d
        else:  # the copy landed, but before the delayed consumer read the old value
            assert d["copy_landed_bad_bytes"] == 0, d
    for d in checks:
        if d["passed"]:
            assert d["first_bad_offset"] is None and d["mismatching_bytes"] == 0, d


# --------------------------------------------------------------------------------------------
# LMCache's pinned pool


def test_pool_run_shape(pool_run: list[dict[str, Any]]) -> None:
    events = pool_run
    assert events[0]["kind"] == "run.started" and events[-1]["kind"] == "run.finished"
    assert len({e["run_id"] for e in events}) == 1
    finished = events[-1]["data"]
    pools = pools_of(events)
    assert finished["status"] == "completed" and finished["pools"] == len(pools) and finished["skipped"] == []
    for d in pools:
        assert check_data("probe.pinned", d) is None, d
    settings = events[0]["data"]["params"]["settings"]
    assert len(pools) == sum(len(s["sizes"]) for s in settings)
    assert {d["bytes_requested"] for d in pools if d["alloc_conf"] is None} == {
        GIB,
        GIB + PAGE,
        8 * GIB + PAGE,
        32 * GIB + PAGE,
    }


def test_pool_with_compiled_ops_is_exact(pool_run: list[dict[str, Any]]) -> None:
    with_ops = [d for d in pools_of(pool_run) if d["with_ops"] is True]
    assert len(with_ops) == 4
    for d in with_ops:
        assert d["alloc_conf"] is None and d["is_pinned"] is True and d["error"] is None
        assert d["bytes_reserved"] == d["bytes_requested"] == d["pool_bytes"], (
            "recorded on an H200 host: LMCache's compiled alloc_pinned_ptr maps exactly the pool"
        )


def test_pool_without_ops_rounds_to_a_power_of_two(pool_run: list[dict[str, Any]]) -> None:
    """torch.empty(size + page, pin_memory=True): the host allocator reserves the next power of two."""
    no_ops = [d for d in pools_of(pool_run) if d["with_ops"] is False]
    assert {d["alloc_conf"] for d in no_ops} == {
        None,
        "PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:8",
        "PYTORCH_CUDA_ALLOC_CONF=pinned_use_background_threads:True",
    }
    for d in no_ops:
        assert d["is_pinned"] is True and d["error"] is None
        assert d["bytes_reserved"] == next_power_of_two(d["bytes_requested"] + PAGE), d
        assert not within_tolerance(d["bytes_requested"], d["bytes_reserved"]), (
            "recorded on an H200 host: neither accepted setting stopped the rounding"
        )
    # Even an exact power of two doubles: the fallback asks torch for one page more than the pool.
    (exact,) = [d for d in no_ops if d["alloc_conf"] is None and d["bytes_requested"] == GIB]
    assert exact["bytes_reserved"] == 2 * GIB


def test_round_threshold_refused(pool_run: list[dict[str, Any]]) -> None:
    refused = [d for d in pools_of(pool_run) if REFUSED_KEY in (d["alloc_conf"] or "")]
    assert refused
    for d in refused:
        assert d["failed_at"] == "cuda-init" and f"Unrecognized key '{REFUSED_KEY}'" in d["error"], d
        assert d["is_pinned"] is False and d["bytes_reserved"] is None and d["with_ops"] is None
    assert {d["torch_version"] for d in refused} == {"2.11.0+cu130"}


def test_pool_judged_per_ops_state(pool_run: list[dict[str, Any]]) -> None:
    limit = pool_run[0]["data"]["params"]["mitigate_up_to"]
    rows = [{**d, "run_id": "r", "source": "lmcache pool"} for d in pools_of(pool_run)]
    sizes = judge_pinned(rows)
    by_ops: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for s in sizes:
        by_ops[s["with_ops"]].append(s)
    assert set(by_ops) == {True, False}
    assert all(s["passed"] and s["mitigation"] is None for s in by_ops[True])
    assert not any(s["passed"] for s in by_ops[False])
    for s in by_ops[False]:
        tried_mitigations = s["bytes_requested"] <= limit
        assert (len(s["tried"]) == 3) is tried_mitigations, s
        assert bool(s["refused"]) is tried_mitigations, s


def test_benchmark_reads_the_records(
    helper_run: list[dict[str, Any]], pool_run: list[dict[str, Any]]
) -> None:
    """``python -m benchmarks helper-probes`` derives its table from these records; the run met its goal."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "helper-probes"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["checks"] == len(checks_of(helper_run)) and out["paths"] == summarize(helper_run)
    assert len(out["pools"]) == len(pools_of(pool_run))
    helpers_s, pool_s = helper_run[-1]["data"]["seconds"], pool_run[-1]["data"]["seconds"]
    assert out["seconds"] == helpers_s and helpers_s + pool_s <= out["goal_seconds"], (
        "recorded: the helper matrix on both GPUs and every pool within the 5-minute goal"
    )

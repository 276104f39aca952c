"""A GPU config's coverage from the recorded LMCache helper and pool probes (two H200s, LMCache 0.5.3).

The synthetic GPU screening's probe runs are dropped, so only the committed
records (tests/data/probes/helper_probes.jsonl and pinned_pool.jsonl) speak for
the helper and pinned layers. The launch's allocator and ops state decide
which records cover it: a config is validated only by probes of its LMCache
version, allocator (and compiled-ops state, when the launch names it) on the
GPU path.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

import pytest

from experiments.targets.vllm._lmcache import Generation
from reports import audit, derive_report
from reports._validation import HELPERS as HELPER_LAYER
from reports._validation import PINNED, SERVICE
from tests._synthetic import Shape, generate
from tests.probes.test_helper_data import checks_of, load

FLAT = ("lmcache_version", "lmcache_allocator", "lmcache_ops")


@pytest.fixture(scope="module")
def records() -> list[dict[str, Any]]:
    return [*load("helper_probes.jsonl"), *load("pinned_pool.jsonl")]


def _screening_with(records: list[dict[str, Any]], lmcache: dict[str, Any]) -> list[dict[str, Any]]:
    """The synthetic GPU screening without its probe runs, its ON launches naming ``lmcache``."""
    synthetic, _ = generate(shape=Shape(target="vllm", transfer_path="gpu"))
    probe_runs = {
        e["run_id"]
        for e in synthetic
        if e["kind"] == "run.started" and e["data"]["experiment"].startswith("probe.")
    }
    events = [*records, *(e for e in synthetic if e["run_id"] not in probe_runs)]
    for e in events:
        if e["kind"] == "deployment.launched" and e["data"].get("lmcache_version"):
            e["data"] = {**{k: v for k, v in e["data"].items() if k not in FLAT}, **lmcache}
    return events


def _coverage(build_lite: Any, events: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    src = build_lite(events)
    (cfg,) = derive_report(src)["tables"]["validation"]["configs"]
    return cfg, {f.code: f for f in audit(src)}


# (allocator, ops named at launch) -> (helper layer, pinned layer), as the two H200s recorded them.
EXPECTED = {
    ("mixed", None): ("pass", "failed"),
    ("mixed", True): ("pass", "pass"),
    ("mixed", False): ("pass", "failed"),
    ("lazy", True): ("pass", "pass"),
    ("lazy", False): ("failed", "failed"),
    ("lazy", None): ("failed", "failed"),
}


@pytest.mark.parametrize(("allocator", "ops"), list(EXPECTED))
def test_coverage_of_a_gpu_config_from_these_records(
    build_lite: Any, records: list[dict[str, Any]], allocator: str, ops: bool | None
) -> None:
    flat = {"lmcache_version": "0.5.3", "lmcache_allocator": allocator, "lmcache_ops": ops}
    cfg, findings = _coverage(build_lite, _screening_with(records, flat))
    helper, pinned = EXPECTED[(allocator, ops)]
    # The expectation follows from the records: some check of the paths this config names failed.
    fails = any(
        not d["passed"]
        for d in checks_of(records)
        if d["allocator"] == allocator and (ops is None or d["with_ops"] == ops)
    )
    assert (helper == "failed") is fails
    assert (cfg["layers"][HELPER_LAYER], cfg["layers"][PINNED]) == (helper, pinned), cfg
    assert ("helper-probe-failed" in findings) is (allocator == "lazy" and fails)
    # The no-ops pool rounds; that blocks only a config it judges (ops not named, or named absent).
    assert ("pinned-rounding" in findings) is (pinned == "failed")
    assert not cfg["passed"] and "validation-missing" in findings
    if allocator == "lazy" and fails:
        detail = findings["helper-probe-failed"].detail
        gpus = len({d["gpu"]["uuid"] for d in checks_of(records)})
        per_path = gpus * len(records[0]["data"]["params"]["sizes"]) * records[0]["data"]["params"]["trials"]
        for direction in ("d2h", "h2d"):
            assert f"{direction} delayed without compiled ops via torch_ops.lmcache_memcpy_async" in detail
        assert f"{per_path} of {per_path} failed" in detail and "first bad byte at offset 0" in detail
        assert "undelayed" not in detail and "with compiled ops" not in detail


@pytest.mark.parametrize("ops_named", [False, True])
def test_the_gpu_studys_on_launch(build_lite: Any, records: list[dict[str, Any]], ops_named: bool) -> None:
    """LMCache 0.5.3 as the first GPU study (tests/data/gpu) launched it: remote mode, no allocator asked.

    0.5.3's local CPU backend uses the mixed allocator whatever is asked, so the
    launch records ``allocator.in_use: mixed`` and the mixed paths, which passed
    every check on both GPUs, cover it. The launch does not say whether LMCache's
    compiled ops were loaded, so the pool of either ops state counts, and the
    pool without them reserved twice what it asked: the pinned layer fails.
    Naming the ops at launch (they were present on that image) would pass it.
    """
    lmcache = Generation(mode="remote", version="0.5.3", chunk_size=256, cpu_gb=4, allocator=None)
    launched = lmcache.config("127.0.0.1")
    assert launched["allocator"]["in_use"] == "mixed" and "ops" not in launched
    if ops_named:
        launched = {**launched, "ops": True}
    cfg, findings = _coverage(build_lite, _screening_with(records, {"lmcache": launched}))
    ops = True if ops_named else None
    assert (cfg["lmcache_version"], cfg["lmcache_allocator"], cfg["lmcache_ops"]) == ("0.5.3", "mixed", ops)
    assert cfg["transfer_paths"] == ["gpu"]
    assert cfg["layers"][HELPER_LAYER] == "pass" and "helper-probe-failed" not in findings
    missing = findings["validation-missing"].detail
    assert HELPER_LAYER not in missing
    if ops_named:
        assert cfg["layers"][PINNED] == "pass" and PINNED not in missing
    else:
        assert cfg["layers"][PINNED] == "failed" and PINNED in missing


GPU_STUDY = Path(__file__).resolve().parents[1] / "data" / "gpu" / "ledger.jsonl.xz"


def test_the_committed_gpu_study_with_these_records(build_lite: Any, records: list[dict[str, Any]]) -> None:
    """The committed GPU study (same two H200s, LMCache 0.5.3) judged with every recorded probe beside it.

    Its ON config is covered by the helper layer (the mixed allocator's paths
    passed) and fails the pinned layer (its launch names no ops state, and
    LMCache's pool without compiled ops rounds); that is why it is not validated.
    """
    with lzma.open(GPU_STUDY, "rt", encoding="utf-8") as fh:
        study = [json.loads(line) for line in fh if line.strip()]
    assert not [e for e in study if e["kind"].startswith("probe.")], "the study's export carries no probes"
    torch_level = [*load("copy_ordering.jsonl"), *load("pinned_alloc.jsonl")]
    src = build_lite([*torch_level, *records, *study])
    configs = derive_report(src)["tables"]["validation"]["configs"]
    launched = [e["data"] for e in study if e["kind"] == "deployment.launched" and e["data"].get("lmcache")]
    named = {
        (d["lmcache"]["version"], d["lmcache"]["allocator"]["in_use"], d["transfer_path"]) for d in launched
    }
    assert named == {("0.5.3", "mixed", "gpu")} and not any("ops" in d["lmcache"] for d in launched)
    (cfg,) = configs
    assert cfg["config_sha256"] == launched[0]["config_sha256"]
    assert (cfg["lmcache_version"], cfg["lmcache_allocator"], cfg["lmcache_ops"]) == ("0.5.3", "mixed", None)
    assert cfg["layers"]["byte probes (copy ordering)"] == "pass"
    assert cfg["layers"][HELPER_LAYER] == "pass"
    assert cfg["layers"][PINNED] == "failed"  # ops not named: LMCache's pool without them counts, and rounds
    validation = [
        e["data"]
        for e in study
        if e["kind"] == "assertion.evaluated" and e["data"].get("config_sha256") == cfg["config_sha256"]
    ]
    assert validation and any(not d["passed"] for d in validation)
    assert cfg["layers"][SERVICE] == "missing"  # its validation run failed assertions
    findings = audit(src)
    (missing,) = [f for f in findings if f.code == "validation-missing"]
    assert PINNED in missing.detail and HELPER_LAYER not in missing.detail
    assert not [f for f in findings if f.code == "helper-probe-failed"]
    assert not cfg["passed"]

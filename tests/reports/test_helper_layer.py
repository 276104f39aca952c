"""The runtime-helper and pinned layers: tied to the configs they cover, judged by rule 1.

A GPU ON config is covered by helper checks of its LMCache version and
allocator (and compiled-ops state when its launch names it); a lazy-allocator
config on a failing path draws ``helper-probe-failed`` while its tables are
still derived; a pinned pool that rounds with no setting fixing it draws
``pinned-rounding`` with requested and reserved bytes.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from reports import audit, derive_report
from reports._validation import (
    FAILED,
    HELPERS,
    MISSING,
    PASS,
    PINNED,
    judge_pinned,
    pinned_tolerance,
    within_tolerance,
)
from tests._synthetic import Flaws, Shape, generate

GPU = Shape(target="vllm", transfer_path="gpu")
GIB = 1 << 30


def _config(src: Any) -> dict[str, Any]:
    (cfg,) = derive_report(src)["tables"]["validation"]["configs"]
    return cfg


def _codes(src: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for f in audit(src):
        out.setdefault(f.code, []).append(f)
    return out


def test_mixed_config_passes_although_the_lazy_path_fails(build_lite: Any) -> None:
    events, _ = generate(shape=GPU)
    src = build_lite(events)
    report = derive_report(src)
    cfg = _config(src)
    assert (cfg["lmcache_version"], cfg["lmcache_allocator"]) == ("0.5.3", "mixed")
    assert cfg["layers"][HELPERS] == PASS and cfg["layers"][PINNED] == PASS and cfg["passed"]
    layers = {x["layer"]: x for x in report["tables"]["validation"]["layers"]}
    assert [x["layer"] for x in report["tables"]["validation"]["layers"]] == [
        "byte probes (copy ordering)",
        HELPERS,
        PINNED,
        "service regression",
    ]
    helpers = layers[HELPERS]
    lazy = [p for p in helpers["paths"] if p["allocator"] == "lazy" and p["delayed"]]
    assert lazy and all(p["failed"] == p["checks"] > 0 for p in lazy)  # shown: the diagnosis
    assert helpers["status"] == PASS  # no config in scope uses the lazy allocator
    pool = [s for s in layers[PINNED]["sizes"] if s["source"] == "lmcache pool"]
    assert [s["mitigation"] for s in pool] == ["PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True"]
    assert not {"helper-probe-failed", "pinned-rounding", "validation-missing"} & set(_codes(src))


def test_lazy_config_on_a_failing_path_is_blocked_but_derived(build_lite: Any) -> None:
    events, planted = generate(shape=GPU, flaws=Flaws(helper_failing=True))
    src = build_lite(events)
    cfg = _config(src)
    assert cfg["lmcache_allocator"] == "lazy" and cfg["layers"][HELPERS] == FAILED
    codes = _codes(src)
    (failed,) = codes["helper-probe-failed"]
    assert failed.severity == "blocking"
    assert failed.target == planted["helper_failing"] == cfg["config_sha256"]
    assert "d2h delayed without compiled ops via torch_ops.lmcache_memcpy_async" in failed.detail
    assert "5 of 5 failed" in failed.detail and failed.detail.endswith("first bad byte at offset 0")
    (missing,) = codes["validation-missing"]
    assert "runtime helpers (LMCache) (failed)" in missing.detail
    tables = derive_report(src)["tables"]
    assert tables["ttft"] and tables["sessions"], "tables are still derived; only publishing is gated"


def _relabel(events: list[dict[str, Any]], kind: str, **fields: Any) -> list[dict[str, Any]]:
    out = copy.deepcopy(events)
    for e in out:
        if e["kind"] == kind:
            e["data"].update(fields)
    return out


def test_helper_checks_of_another_lmcache_version_do_not_count(build_lite: Any) -> None:
    events, _ = generate(shape=GPU)
    src = build_lite(_relabel(events, "probe.helper", lmcache_version="0.5.6"))
    cfg = _config(src)
    assert cfg["layers"][HELPERS] == MISSING
    assert cfg["notes"][HELPERS] == "no helper checks of LMCache 0.5.3 with the mixed allocator"
    (finding,) = _codes(src)["validation-missing"]
    note = "runtime helpers (LMCache) (no helper checks of LMCache 0.5.3 with the mixed allocator)"
    assert note in finding.detail


def test_named_ops_state_must_match(build_lite: Any) -> None:
    events, _ = generate(shape=GPU)
    # The launch says LMCache's compiled ops were loaded; every probe ran without them.
    src = build_lite(_relabel(events, "deployment.launched", lmcache_ops=True))
    cfg = _config(src)
    assert cfg["layers"][HELPERS] == MISSING
    # the pool of that version and ops state was not probed either: torch's allocator stands in
    assert cfg["layers"][PINNED] == PASS


def test_launch_without_lmcache_names_leaves_helpers_missing(build_lite: Any) -> None:
    events, _ = generate(shape=GPU)
    for e in events:
        if e["kind"] == "deployment.launched":
            for key in ("lmcache_version", "lmcache_allocator", "lmcache_ops"):
                e["data"].pop(key, None)
    cfg = _config(build_lite(events))
    assert cfg["layers"][HELPERS] == MISSING
    assert cfg["notes"][HELPERS] == "its launch does not name the LMCache version and allocator"


def test_pinned_rounding_names_requested_and_reserved(build_lite: Any) -> None:
    events, planted = generate(shape=GPU, flaws=Flaws(pinned_rounding=True))
    src = build_lite(events)
    cfg = _config(src)
    assert cfg["layers"][PINNED] == FAILED
    (finding,) = _codes(src)["pinned-rounding"]
    assert finding.run_id == planted["pinned_rounding"] and finding.target == f"{GIB + 4096} bytes"
    assert f"requested {GIB + 4096} bytes, reserved {2 * GIB} bytes (2.00x), pinned" in finding.detail
    assert "tried: PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True, none" in finding.detail
    assert any("pinned allocation (failed)" in f.detail for f in _codes(src)["validation-missing"])


# -- rule 1 ------------------------------------------------------------------------------------


def test_tolerance() -> None:
    assert pinned_tolerance(GIB) == GIB // 100 and pinned_tolerance(4096) == 2 * 1024 * 1024
    assert within_tolerance(GIB + 4096, GIB + 8192)
    assert within_tolerance(GIB, GIB + GIB // 100) and not within_tolerance(GIB, GIB + GIB // 100 + 1)
    assert not within_tolerance(GIB + 4096, 2 * GIB) and not within_tolerance(GIB, None)


def _row(conf: str | None, reserved: int | None, **extra: Any) -> dict[str, Any]:
    row = {
        "run_id": "r",
        "source": "lmcache pool",
        "lmcache_version": "0.5.3",
        "with_ops": False,
        "bytes_requested": GIB + 4096,
        "bytes_reserved": reserved,
        "is_pinned": reserved is not None,
        "error": None,
        "failed_at": None,
        "alloc_conf": conf,
    }
    row.update(extra)
    return row


@pytest.mark.parametrize(
    ("rows", "passed", "mitigation"),
    [
        ([_row(None, GIB + 8192)], True, None),
        ([_row(None, 2 * GIB), _row("A", GIB + 8192)], True, "A"),
        ([_row(None, 2 * GIB), _row("A", 2 * GIB)], False, None),
        (
            [
                _row(None, 2 * GIB),
                _row("B", None, error="ValueError: Unrecognized key", failed_at="cuda-init"),
            ],
            False,
            None,
        ),
        ([_row(None, GIB + 8192, is_pinned=False)], False, None),  # pageable is not pinned
    ],
    ids=["unmitigated", "mitigated", "setting-does-not-help", "setting-refused", "not-pinned"],
)
def test_judge_pinned(rows: list[dict[str, Any]], passed: bool, mitigation: str | None) -> None:
    (size,) = judge_pinned(rows)
    assert size["passed"] is passed and size["mitigation"] == mitigation
    assert size["bytes_reserved"] == rows[0]["bytes_reserved"]  # the unmitigated allocation is the evidence
    assert size["refused"] == [r["alloc_conf"] for r in rows if r["failed_at"] == "cuda-init"]
    assert size["series"] == "LMCache 0.5.3 local CPU pool (no compiled ops)"


def test_the_vllm_targets_lmcache_record_is_read(build_lite: Any) -> None:
    # The vllm target names LMCache in a nested object: version and the allocator in use.
    events, _ = generate(shape=GPU)
    for e in events:
        if e["kind"] == "deployment.launched" and e["data"].get("lmcache_version"):
            for key in ("lmcache_version", "lmcache_allocator", "lmcache_ops"):
                e["data"].pop(key)
            e["data"]["lmcache"] = {
                "mode": "remote",
                "version": "0.5.3",
                "allocator": {"requested": None, "in_use": "mixed"},
            }
    cfg = _config(build_lite(events))
    assert (cfg["lmcache_version"], cfg["lmcache_allocator"], cfg["lmcache_ops"]) == ("0.5.3", "mixed", None)
    assert cfg["layers"][HELPERS] == PASS

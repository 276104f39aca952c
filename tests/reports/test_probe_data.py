"""Validation layers and the audit over the real H200 probe records (tests/data/probes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from reports import audit, derive_report
from reports._synthetic import Shape, generate

DATA = Path(__file__).parents[1] / "data" / "probes"


def _records() -> list[dict[str, Any]]:
    files = sorted(DATA.glob("*.jsonl"))
    assert files, f"the real H200 probe records are missing from {DATA}"
    return [orjson.loads(line) for f in files for line in f.read_bytes().splitlines() if line.strip()]


def test_layers_from_real_probes(build_lite: Any) -> None:
    records = _records()
    layers = derive_report(build_lite(records))["tables"]["validation"]["layers"]
    copy, pinned, _ = layers
    raw_delayed = [c for c in copy["cells"] if c["method"] == "raw_fallback" and c["delayed"]]
    ordered = [c for c in copy["cells"] if c["method"] != "raw_fallback"]
    expected_checks = sum(1 for r in records
                          if r["kind"] == "probe.copy" and r["data"]["method"] != "raw_fallback")
    assert copy["checks"] == expected_checks and copy["passed"] is True
    assert all(c["passed"] == c["checks"] for c in ordered)
    assert raw_delayed and all(c["passed"] < c["checks"] for c in raw_delayed)  # the seed's diagnosis
    pinned_records = [r for r in records if r["kind"] == "probe.pinned_alloc"]
    assert pinned["checks"] == len(pinned_records)
    assert pinned["passed"] is any(r["data"]["is_pinned"] and not r["data"].get("error")
                                   for r in pinned_records)


def test_real_probes_validate_a_gpu_screening(build_lite: Any) -> None:
    synthetic, _ = generate(shape=Shape(target="vllm", transfer_path="gpu"))
    # Drop the synthetic probe runs: the real records must carry the GPU layers on their own.
    probe_runs = {e["run_id"] for e in synthetic if e["kind"] == "run.started"
                  and e["data"]["experiment"].startswith("probe.")}
    events = _records() + [e for e in synthetic if e["run_id"] not in probe_runs]
    findings = audit(build_lite(events))
    assert not [f for f in findings if f.code == "validation-missing"]

"""The real pipeline on the sim: `ledger run validation` / `ledger run screening`, then the audit.

Small shapes and a fast sim clock keep each run to a few seconds. Every audit code planted in a
sim run's ledger (the sim's faults included) is tests/reports/test_audit_sim.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger._cli import cli
from reports import audit, derive_report, open_source
from tests.reports._sim_shape import FAST, SMALL, VALIDATION

pytestmark = pytest.mark.slow


def _run(url: str, experiment: str, *params: str) -> int:
    result = CliRunner().invoke(
        cli, ["run", experiment, "--db", url, "--target", "sim", *FAST, *params], catch_exceptions=False
    )
    assert result.exit_code in (0, 1), result.output  # 1: the run itself found a failure
    return result.exit_code


def _codes(url: str) -> dict[str, set[str]]:
    src = open_source(url)
    try:
        out: dict[str, set[str]] = {}
        for f in audit(src):
            out.setdefault(f.code, set()).add(f.severity)
        return out
    finally:
        src.close()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'sim.db'}"


def test_validation_then_screening_is_publishable(url: str) -> None:
    assert _run(url, "validation", *VALIDATION) == 0
    assert _run(url, "screening", *SMALL) == 0
    codes = _codes(url)
    assert not [c for c, sev in codes.items() if "blocking" in sev], codes
    src = open_source(url)
    try:
        report = derive_report(src)
    finally:
        src.close()
    acc = report["accounting"]
    assert acc["pairs"] == acc["matched_pairs"] == acc["measured"] // 2 > 0
    assert report["pairing"]["counts"] == {"matched": acc["pairs"]}
    assert all(c["passed"] for c in report["tables"]["validation"]["configs"])


def test_namespace_leak_excludes_its_block(url: str) -> None:
    _run(url, "validation", *VALIDATION)
    _run(url, "screening", *SMALL, "--param", "fault=namespace-leak")
    assert "namespace-leak" in _codes(url)
    src = open_source(url)
    try:
        assert derive_report(src)["accounting"]["excluded_blocks"]
    finally:
        src.close()


def test_unordered_copy_fault_is_found(url: str) -> None:
    _run(url, "validation", *VALIDATION)
    _run(url, "screening", *SMALL, "--param", "sim_fault=unordered-copy")
    assert "blocking" in _codes(url).get("assertion-failed", set())


def test_a_dying_replica_fails_its_block_and_the_report_excludes_it(url: str) -> None:
    _run(url, "validation", *VALIDATION)
    _run(url, "screening", *SMALL, "--param", "sim_fault=truncated-stream:die=1@replica=1")
    src = open_source(url)
    try:
        report = derive_report(src)
        failed = [b["block_id"] for r in report["runs"] for b in r["blocks"] if b["status"] == "failed"]
        assert failed
        excluded = {e["block_id"]: e for e in report["exclusions"] if e["source"] == "block-failed"}
        assert set(failed) <= set(excluded)
        assert all(excluded[b]["reason"].startswith("block failed: ") for b in failed)
        assert set(failed) <= set(report["accounting"]["excluded_blocks"])
        assert not {p["status"] for p in report["pairing"]["not_matched"]} & {"unpaired-on", "unpaired-off"}
        codes = {f.code: f.severity for f in audit(src)}
    finally:
        src.close()
    assert codes.get("run-incomplete") == "blocking"
    assert "unpaired-request" not in codes

"""The TTFT method: chosen by a run param, recorded on every response, named by the report, audited."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from collectors import DEFAULT_TTFT_METHOD, TTFT_METHODS
from ledger import EventError, NewEvent, open_ledger
from ledger._cli import cli
from ledger._vocabulary import OPTIONAL_ENUMS
from reports import audit, derive_report, open_source, to_markdown
from tests._synthetic import Flaws, generate
from tests.reports.conftest import import_envelopes
from tests.reports.test_sim_pipeline import FAST, SMALL


@pytest.fixture(autouse=True)
def _snapshot_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVLEDGER_CACHE", str(tmp_path / "cache"))


def _run(url: str, *params: str) -> None:
    result = CliRunner().invoke(
        cli,
        ["run", "screening", "--db", url, "--target", "sim", *FAST, *SMALL, *params],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output


def test_the_vocabulary_knows_every_method(tmp_path: Path) -> None:
    ((name, allowed),) = OPTIONAL_ENUMS["response.received"]
    assert name == "ttft_method" and allowed == set(TTFT_METHODS)
    led = open_ledger(f"sqlite:///{tmp_path / 'l.db'}")
    data = {
        "request_id": "r",
        "status": 200,
        "ttft_s": 0.1,
        "t_first": 0.1,
        "t_last": 0.2,
        "e2e_s": 0.3,
        "prompt_tokens": 5,
        "output_tokens": 2,
        "cached_tokens": 0,
        "decode_rate": 10.0,
        "text_sha256": "ab",
        "finish_reason": "length",
        "error": None,
    }
    with pytest.raises(EventError, match="must be one of"):
        led.append(NewEvent("response.received", {**data, "ttft_method": "wall-clock"}))
    # A ledger recorded before methods were recorded still imports; its figures read "unrecorded".
    led.append(NewEvent("response.received", data))
    led.append(NewEvent("response.received", {**data, "ttft_method": "kernel-stamp"}))
    led.close()


def test_an_unknown_method_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    result = CliRunner().invoke(
        cli, ["run", "screening", "--db", url, "--target", "sim", *FAST, "--param", "ttft_method=wall-clock"]
    )
    assert result.exit_code == 2
    assert "ttft_method must be one of kernel-stamp, socket-read, httpx-read" in result.output
    assert not (tmp_path / "l.db").exists() or open_ledger(url).head() is None


@pytest.mark.slow
def test_two_runs_dated_differently_are_recorded_reported_and_flagged(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    _run(url)
    _run(url, "--param", "ttft_method=httpx-read")
    led = open_ledger(url)
    started = list(led.events(kind="run.started"))
    assert [e.data["params"]["ttft_method"] for e in started] == [DEFAULT_TTFT_METHOD, "httpx-read"]
    by_run: dict[str, set[str]] = {}
    for e in led.events(kind="response.received"):
        by_run.setdefault(str(e.run_id), set()).add(e.data["ttft_method"])
    first, second = (str(e.run_id) for e in started)
    assert by_run == {first: {DEFAULT_TTFT_METHOD}, second: {"httpx-read"}}
    led.close()

    src = open_source(url)
    try:
        mixed = [f for f in audit(src) if f.code == "ttft-method-mixed"]
        assert [(f.severity, f.target) for f in mixed] == [("warning", "runs")]
        assert f"{DEFAULT_TTFT_METHOD}: {first[:8]}" in mixed[0].detail
        assert f"httpx-read: {second[:8]}" in mixed[0].detail
        assert not [f for f in audit(src, first) if f.code == "ttft-method-mixed"]  # one run: one method
        report = derive_report(src)
    finally:
        src.close()
    methods = report["measurement"]["ttft_methods"]
    assert {(m["run_id"], m["ttft_method"]) for m in methods} == {
        (first, DEFAULT_TTFT_METHOD),
        (second, "httpx-read"),
    }
    ttft_rows = sum(
        len(r["arms"][arm]["observations"]) for r in report["tables"]["ttft"] for arm in ("ON", "OFF")
    )
    assert sum(m["observations"] for m in methods) == ttft_rows
    markdown = to_markdown(report)
    assert f"run {first[:8]}: TTFT dated by {DEFAULT_TTFT_METHOD}, " in markdown
    assert f"run {second[:8]}: TTFT dated by httpx-read, the time httpx handed the read over" in markdown


def test_one_run_with_mixed_methods_is_a_warning_and_the_report_says_mixed(tmp_path: Path) -> None:
    """A run whose responses were dated two ways (e.g. the kernel gave some reads no stamp)."""
    events, planted = generate(flaws=Flaws(ttft_method_mixed=True))
    src = open_source(import_envelopes(f"sqlite:///{tmp_path / 'syn.db'}", events))
    try:
        (found,) = [f for f in audit(src) if f.code == "ttft-method-mixed"]
        assert found.severity == "warning" and found.run_id == planted["ttft_method_mixed"]
        assert "httpx-read (1)" in found.detail and "kernel-stamp (" in found.detail
        markdown = to_markdown(derive_report(src))
    finally:
        src.close()
        src.ledger.close()
    assert "TTFT dated by MIXED methods (httpx-read 1, kernel-stamp " in markdown

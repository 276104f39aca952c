"""``ledger import --from vllm-bench|guidellm``: real result files of those tools, recorded and audited.

The files under tests/data/imports were written by the tools themselves
against the real vLLM CPU engine (tests/data/imports/generate.py); every
expected figure here is read from the file, never typed in.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from ledger import open_ledger
from ledger._cli import cli

DATA = Path(__file__).parents[1] / "data" / "imports"
VLLM_BENCH, GUIDELLM = DATA / "vllm-bench.json", DATA / "guidellm.json"
LACKS = {"import-unpaired", "import-no-hit-counters", "import-unvalidated"}


@pytest.fixture(autouse=True)
def _snapshot_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVLEDGER_CACHE", str(tmp_path / "cache"))


def _ledger(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _events(url: str) -> list[Any]:
    with open_ledger(url, create=False) as led:
        return list(led.events())


def _guidellm_records(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        rec
        for bench in report["benchmarks"]
        for status in ("successful", "errored", "incomplete")
        for rec in bench["requests"].get(status) or []
    ]


def test_vllm_bench_file_is_recorded_with_provenance_and_every_request(sqlite_url: str) -> None:
    result = _ledger("--db", sqlite_url, "import", "--from", "vllm-bench", str(VLLM_BENCH))
    assert result.exit_code == 0, result.output
    written = json.loads(VLLM_BENCH.read_bytes())
    events = _events(sqlite_url)
    (recorded,) = [e for e in events if e.kind == "import.recorded"]
    requests = [e for e in events if e.kind == "import.request"]
    assert recorded.data["tool"] == "vllm-bench"
    assert recorded.data["tool_version"] == written["vllm_version"]
    assert recorded.data["file_sha256"] == hashlib.sha256(VLLM_BENCH.read_bytes()).hexdigest()
    assert recorded.data["file_bytes"] == VLLM_BENCH.stat().st_size
    assert recorded.data["requests"] == len(requests) == len(written["ttfts"]) > 0
    assert recorded.data["summary"]["completed"] == written["completed"]
    assert {e.run_id for e in events} == {recorded.run_id}
    assert [r.data["ttft_s"] for r in requests] == written["ttfts"]
    assert [r.data["output_tokens"] for r in requests] == written["output_lens"]
    assert [r.data["itl_s"] for r in requests] == written["itls"]
    assert all(r.data["cached_tokens"] is None for r in requests)


def test_guidellm_file_is_recorded_with_provenance_and_every_request(sqlite_url: str) -> None:
    result = _ledger("--db", sqlite_url, "import", "--from", "guidellm", str(GUIDELLM))
    assert result.exit_code == 0, result.output
    written = json.loads(GUIDELLM.read_bytes())
    records = _guidellm_records(written)
    events = _events(sqlite_url)
    (recorded,) = [e for e in events if e.kind == "import.recorded"]
    requests = [e for e in events if e.kind == "import.request"]
    assert recorded.data["tool"] == "guidellm"
    assert recorded.data["tool_version"] == written["metadata"]["guidellm_version"]
    assert recorded.data["file_sha256"] == hashlib.sha256(GUIDELLM.read_bytes()).hexdigest()
    assert recorded.data["model"] == written["config"]["spec"]["backend"]["model"]
    assert recorded.data["requests"] == len(requests) == len(records) > 0
    assert [r.data["ttft_s"] for r in requests] == [rec["time_to_first_token_ms"] / 1e3 for rec in records]
    assert [r.data["prompt_tokens"] for r in requests] == [rec["prompt_tokens"] for rec in records]
    # The server reports prompt token details, so GuideLLM kept each response's cached tokens.
    assert [r.data["cached_tokens"] for r in requests] == [rec["cached_tokens"] for rec in records]


def test_the_audit_says_what_imported_results_lack(sqlite_url: str) -> None:
    runs = {}
    for tool, file in (("vllm-bench", VLLM_BENCH), ("guidellm", GUIDELLM)):
        assert _ledger("--db", sqlite_url, "import", "--from", tool, str(file)).exit_code == 0
        (recorded,) = [
            e for e in _events(sqlite_url) if e.kind == "import.recorded" and e.data["tool"] == tool
        ]
        runs[tool] = recorded.run_id

    audit = _ledger("--db", sqlite_url, "audit", "--json")
    assert audit.exit_code == 0, audit.output
    findings = json.loads(audit.output)["findings"]
    for tool, run_id in runs.items():
        mine = [f for f in findings if f["run_id"] == run_id]
        assert {f["code"] for f in mine} == LACKS, tool
        assert all(f["severity"] == "blocking" for f in mine)
        assert all(f["target"] in (VLLM_BENCH.name, GUIDELLM.name) for f in mine)
        (counters,) = [f for f in mine if f["code"] == "import-no-hit-counters"]
        # GuideLLM's file has the responses' cached-token totals, vLLM's benchmark none: said apart.
        totals = "only the responses' cached-token totals" in counters["detail"]
        assert totals == (tool == "guidellm"), counters["detail"]
        # One run's audit sees only that file's findings.
        scoped = _ledger("--db", sqlite_url, "audit", "--run", str(run_id), "--json")
        assert scoped.exit_code == 0, scoped.output
        assert {f["run_id"] for f in json.loads(scoped.output)["findings"]} == {run_id}
    assert _ledger("--db", sqlite_url, "audit", "--publish").exit_code == 1

    sql = _ledger("--db", sqlite_url, "sql", "SELECT count(*) AS n FROM import_request", "--format", "json")
    written = len(json.loads(VLLM_BENCH.read_bytes())["ttfts"])
    written += len(_guidellm_records(json.loads(GUIDELLM.read_bytes())))
    assert sql.exit_code == 0 and json.loads(sql.output)["n"] == written


def _bad_files(tmp_path: Path) -> dict[str, tuple[str, Path, str]]:
    """name -> (tool, file, what the error must say)."""
    raw = VLLM_BENCH.read_bytes()
    truncated = tmp_path / "truncated.json"
    truncated.write_bytes(raw[: len(raw) // 2])
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    summary_only = tmp_path / "summary-only.json"
    summary = {k: v for k, v in json.loads(raw).items() if k not in ("ttfts", "itls", "errors")}
    summary_only.write_text(json.dumps(summary))
    uneven = tmp_path / "uneven.json"
    cut = json.loads(raw)
    cut["ttfts"] = cut["ttfts"][:-1]
    uneven.write_text(json.dumps(cut))
    mistyped = tmp_path / "mistyped.json"
    report = json.loads(GUIDELLM.read_bytes())
    report["benchmarks"][0]["requests"]["successful"][0]["prompt_tokens"] = "sixty-four"
    mistyped.write_text(json.dumps(report))
    return {
        "guidellm file as vllm-bench": ("vllm-bench", GUIDELLM, "not written by vllm bench serve"),
        "vllm-bench file as guidellm": ("guidellm", VLLM_BENCH, "no 'benchmarks' list"),
        "truncated JSON": ("vllm-bench", truncated, "truncated"),
        "not text": ("guidellm", binary, "not UTF-8"),
        "saved without --save-detailed": ("vllm-bench", summary_only, "--save-detailed"),
        "lists of different lengths": ("vllm-bench", uneven, "different lengths"),
        "a field of the wrong type": ("guidellm", mistyped, "prompt_tokens should be an integer"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "guidellm file as vllm-bench",
        "vllm-bench file as guidellm",
        "truncated JSON",
        "not text",
        "saved without --save-detailed",
        "lists of different lengths",
        "a field of the wrong type",
    ],
)
def test_bad_input_is_refused_naming_what_is_wrong_and_writes_nothing(
    case: str, sqlite_url: str, tmp_path: Path
) -> None:
    tool, file, said = _bad_files(tmp_path)[case]
    assert _ledger("--db", sqlite_url, "init").exit_code == 0
    result = CliRunner().invoke(cli, ["--db", sqlite_url, "import", "--from", tool, str(file)])
    assert result.exit_code == 2, result.output
    assert said in result.output and file.name in result.output and "nothing was recorded" in result.output
    assert _events(sqlite_url) == []

"""Size labels, validation layers by transfer path, failed/aborted blocks, values missing from a pair."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from reports import audit, derive_report, to_markdown
from reports._render import size, terminal_sections
from tests._synthetic import Flaws, Shape, generate

from . import _oracle


@pytest.mark.parametrize(
    ("tokens", "label"),
    [
        (8000, "8k"),
        (32000, "32k"),
        (128000, "128k"),
        (256000, "256k"),  # the screening's sizes
        (8192, "8k"),
        (32768, "32k"),
        (131072, "128k"),
        (262144, "256k"),  # powers of two
        (1000, "1k"),
        (2000, "2k"),
        (1055, "1055"),
        (500, "500"),
        (None, "–"),
    ],
)
def test_size_labels(tokens: int | None, label: str) -> None:
    assert size(tokens) == label


def test_markdown_labels_the_screening_sizes_in_thousands(build_lite: Any) -> None:
    events, _ = generate(shape=Shape(sizes=(8192, 131072)))
    for e in events:  # the real screening's nominal sizes are round thousands
        if e["kind"] == "request.sent" and e["data"]["workload"] == "micro" and not e["data"]["warmup"]:
            e["data"]["nominal_tokens"] = {8192: 8000, 131072: 128000}[e["data"]["nominal_tokens"]]
    md = to_markdown(derive_report(build_lite(events)))
    assert "| 128k | cold |" in md and "| 8k | cold |" in md
    assert "125k" not in md and "128000" not in md


# -- validation layers (Table 2) by transfer path ---------------------------------------------


def _layers(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {x["layer"]: x for x in report["tables"]["validation"]["layers"]}


@pytest.mark.parametrize("path", ["sim", "cpu"])
def test_gpu_layers_not_applicable_off_gpu_paths(build_lite: Any, path: str) -> None:
    events, _ = generate(shape=Shape(transfer_path=path))
    src = build_lite(events)
    report = derive_report(src)
    layers = _layers(report)
    for name in ("byte probes (copy ordering)", "runtime helpers (LMCache)", "pinned allocation"):
        assert layers[name]["status"] == "not applicable" and layers[name]["applicable"] is False
        assert path in layers[name]["applicability"]
    assert layers["service regression"]["status"] == "pass"
    (cfg,) = report["tables"]["validation"]["configs"]
    assert cfg["layers"] == {
        "service regression": "pass",
        "byte probes (copy ordering)": "not applicable",
        "runtime helpers (LMCache)": "not applicable",
        "pinned allocation": "not applicable",
    }
    assert cfg["passed"] and cfg["missing"] == []
    md = to_markdown(report)
    applies = "transfer_path gpu (LMCache's pool: same LMCache version)"
    assert f"| pinned allocation | {applies} | 0 | 0 | not applicable |" in md
    assert "missing" not in md.split("## Validation coverage")[1]
    assert not [f for f in audit(src) if f.code == "validation-missing"]


def test_gpu_path_without_probes_is_missing_in_table_and_audit(build_lite: Any) -> None:
    events, _ = generate(shape=Shape(target="vllm", transfer_path="gpu"))
    probe_runs = {
        e["run_id"]
        for e in events
        if e["kind"] == "run.started" and e["data"]["experiment"].startswith("probe.")
    }
    src = build_lite([e for e in events if e["run_id"] not in probe_runs])
    report = derive_report(src)
    layers = _layers(report)
    assert layers["byte probes (copy ordering)"]["status"] == "not passed"
    assert layers["pinned allocation"]["status"] == "not passed"
    assert layers["runtime helpers (LMCache)"]["status"] == "not passed"
    (cfg,) = report["tables"]["validation"]["configs"]
    gpu_layers = ["byte probes (copy ordering)", "runtime helpers (LMCache)", "pinned allocation"]
    assert cfg["missing"] == gpu_layers and not cfg["passed"]
    (finding,) = [f for f in audit(src) if f.code == "validation-missing"]
    assert finding.severity == "blocking" and finding.target == cfg["config_sha256"]
    assert "byte probes (copy ordering), runtime helpers (LMCache) (no helper checks of" in finding.detail
    assert finding.detail.endswith("pinned allocation")
    assert "service regression" not in finding.detail


def test_gpu_path_with_probes_passes(build_lite: Any) -> None:
    events, _ = generate(shape=Shape(target="vllm", transfer_path="gpu"))
    report = derive_report(build_lite(events))
    assert {x["status"] for x in report["tables"]["validation"]["layers"]} == {"pass"}


def test_sim_path_without_validation_run_is_missing_only_the_regression(build_lite: Any) -> None:
    events, _ = generate(flaws=Flaws(validation_missing=True))
    src = build_lite(events)
    (cfg,) = derive_report(src)["tables"]["validation"]["configs"]
    assert cfg["missing"] == ["service regression"]
    (finding,) = [f for f in audit(src) if f.code == "validation-missing"]
    assert finding.detail.endswith("no passing service regression")


# -- failed and aborted blocks -------------------------------------------------------------------


def test_failed_block_is_excluded_everywhere_with_its_reason(build_lite: Any) -> None:
    events, planted = generate(flaws=Flaws(block_failed=True))
    block = planted["block_failed"]
    report = derive_report(build_lite(events))
    acc = report["accounting"]
    assert acc == _oracle.accounting(events)
    assert acc["excluded_blocks"] == [block]
    (ex,) = report["exclusions"]
    assert ex["block_id"] == block and ex["source"] == "block-failed"
    assert ex["reason"] == "block failed: BlockFailed: replica 1 unhealthy (connection refused)"
    # Its OFF partner block's requests are listed as excluded pairs, never as unpaired.
    counts = report["pairing"]["counts"]
    assert "unpaired-off" not in counts and "unpaired-on" not in counts
    assert counts["excluded"] == 192
    assert acc["measured"] == 768 - 192  # the partner OFF block's requests still count as measured
    # No observation of the failed block reaches a median: pair 0 has no ON observation left.
    for row in report["tables"]["ttft"]:
        assert 0 not in row["arms"]["ON"]["observation_pairs"]
        assert row["matched_units"] == 2
    for row in report["tables"]["sessions"]:
        assert row["arms"]["ON"]["observation_pairs"] == [1, 1]
    md = to_markdown(report)
    assert "block-failed" in md and "replica 1 unhealthy" in md


def test_aborted_block_is_excluded(build_lite: Any) -> None:
    events, _ = generate()
    events = copy.deepcopy(events)
    finished = [e for e in events if e["kind"] == "block.finished"]
    last = finished[-1]
    last["data"].update(status="aborted", error="interrupted")
    report = derive_report(build_lite(events))
    assert report["accounting"]["excluded_blocks"] == [last["block_id"]]
    assert report["exclusions"][0]["reason"] == "block aborted: interrupted"
    assert report["accounting"] == _oracle.accounting(events)


def test_block_failed_flaw_fails_the_audit_on_the_run(build_lite: Any) -> None:
    events, _ = generate(flaws=Flaws(block_failed=True))
    findings = audit(build_lite(events))
    blocking = {f.code for f in findings if f.severity == "blocking"}
    # The run finished failed; the block's missing generation/windows are not unpaired requests.
    assert blocking == {"run-incomplete"}


# -- a pair whose ON value is missing is not a matched unit ------------------------------------


def test_decode_pair_without_on_rate_is_skipped(build_lite: Any) -> None:
    events, _ = generate()
    events = copy.deepcopy(events)
    on_blocks = {e["block_id"] for e in events if e["kind"] == "block.started" and e["data"]["arm"] == "ON"}
    gen_ids = {
        e["data"]["request_id"]
        for e in events
        if e["kind"] == "request.sent"
        and e["data"]["workload"] == "generation"
        and e["block_id"] in on_blocks
    }
    victim = None
    for e in events:
        if e["kind"] == "response.received" and e["data"]["request_id"] in gen_ids:
            e["data"].update(decode_rate=None, t_last=e["data"]["t_first"])  # a one-chunk stream
            victim = e["data"]["request_id"]
            break
    assert victim
    report = derive_report(build_lite(events))
    units = sum(r["matched_units"] for r in report["tables"]["decode"])
    assert units == 16 - 1


def test_generation_pairs_by_output_length_not_by_send_order(build_lite: Any) -> None:
    events, _ = generate()
    events = copy.deepcopy(events)
    on_block = next(
        e["block_id"] for e in events if e["kind"] == "block.started" and e["data"]["arm"] == "ON"
    )
    idx = [
        i
        for i, e in enumerate(events)
        if e["kind"] == "request.sent"
        and e["block_id"] == on_block
        and e["data"]["workload"] == "generation"
        and e["data"]["nominal_tokens"] == 8192
        and e["data"]["step"] == "cold"
    ]
    assert [events[i]["data"]["params"]["max_tokens"] for i in idx] == [512, 2048]
    events[idx[0]], events[idx[1]] = events[idx[1]], events[idx[0]]  # this block sent 2048 first
    report = derive_report(build_lite(events))
    assert report["pairing"]["counts"] == {"matched": 384}
    assert report["accounting"]["matched_pairs"] == 384


def test_narrow_terminal_leaves_out_observations_but_says_where_they_are(build_lite: Any) -> None:
    events, _ = generate()
    report = derive_report(build_lite(events))
    narrow = {s.title: s for s in terminal_sections(report, 80)}
    wide = {s.title: s for s in terminal_sections(report, 200)}
    table3 = next(t for t in narrow if t.startswith("Table 3"))
    assert "observations" not in narrow[table3].headers and "observations" in wide[table3].headers
    assert all(len(r) == len(narrow[table3].headers) for r in narrow[table3].rows)
    assert "every observation" in narrow[table3].notes[0]
    assert "| 8k |" in to_markdown(report)  # Markdown keeps every column


def test_tables_sort_sizes_and_lengths_numerically(build_lite: Any) -> None:
    events, _ = generate()
    tables = derive_report(build_lite(events))["tables"]
    assert [r["nominal_tokens"] for r in tables["sessions"]] == [32768, 32768, 131072, 131072]
    decode = [(r["nominal_tokens"], r["step"], r["max_tokens"]) for r in tables["decode"]]
    assert decode == sorted(decode, key=lambda k: (k[0], k[1], k[2]))


def _declare(events: list[dict[str, Any]], scope: str, target: str, reason: str) -> list[dict[str, Any]]:
    run_id = next(
        e["run_id"] for e in events if e["kind"] == "run.started" and e["data"]["experiment"] == "screening"
    )
    return [
        *events,
        {
            "id": "0190f000-0000-7000-8000-0000000000aa",
            "ts": "2026-09-20T00:00:00.000000Z",
            "kind": "exclusion.declared",
            "run_id": run_id,
            "block_id": None,
            "data": {"scope": scope, "target": target, "reason": reason},
        },
    ]


def test_declared_request_exclusion_drops_its_pair_and_says_why(build_lite: Any) -> None:
    events, _ = generate()
    victim = next(
        e["data"]["request_id"]
        for e in events
        if e["kind"] == "request.sent"
        and e["data"]["workload"] == "micro"
        and e["data"]["step"] == "cross"
        and not e["data"]["warmup"]
    )
    report = derive_report(build_lite(_declare(events, "request", victim, "operator typo in payload")))
    assert report["accounting"]["measured"] == 767 and report["accounting"]["pairs"] == 383
    assert report["pairing"]["counts"] == {"excluded": 1, "matched": 383}
    (ex,) = report["exclusions"]
    assert ex["source"] == "declared" and ex["reason"] == f"request {victim}: operator typo in payload"


def test_declared_run_exclusion_excludes_every_block(build_lite: Any) -> None:
    events, _ = generate()
    run_id = next(
        e["run_id"] for e in events if e["kind"] == "run.started" and e["data"]["experiment"] == "screening"
    )
    src = build_lite(_declare(events, "run", run_id, "host was not isolated"))
    report = derive_report(src)
    assert len(report["accounting"]["excluded_blocks"]) == 4 and report["accounting"]["measured"] == 0
    assert {e["reason"] for e in report["exclusions"]} == {"host was not isolated"}
    assert report["tables"]["ttft"] == [] and report["tables"]["sessions"] == []
    assert "declared-exclusion" in {f.code for f in audit(src)}

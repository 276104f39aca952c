"""Report numbers against an independent derivation, exclusions, pairing, statistics, determinism."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reports import derive_report, open_source, to_json, to_markdown
from tests._synthetic import Flaws, Shape, generate

from . import _oracle

FLAWS = [None, "namespace_leak", "unpaired", "payload_mismatch", "declared_exclusion"]


@pytest.mark.parametrize("flaw", FLAWS)
def test_accounting_matches_independent_derivation(build: Any, flaw: str | None) -> None:
    events, _ = generate(flaws=Flaws(**({flaw: True} if flaw else {})))
    report = derive_report(build(events))
    assert report["accounting"] == _oracle.accounting(events)


def test_clean_accounting_is_the_seed_screening(build_lite: Any) -> None:
    events, _ = generate()
    acc = derive_report(build_lite(events))["accounting"]
    assert acc == {
        "measured": 768,
        "warmups": 24,
        "pairs": 384,
        "matched_pairs": 384,
        "exact_value_checks": 736,
        "exact_value_passed": 736,
        "forced_length_checks": 32,
        "not_independent": 448,
        "excluded_blocks": [],
    }


def test_ttft_table_matches_raw_responses(build_lite: Any) -> None:
    events, _ = generate()
    report = derive_report(build_lite(events))
    expected = _oracle.ttft_cells(events)
    rows = {(r["nominal_tokens"], r["locality"]): r for r in report["tables"]["ttft"]}
    assert set(rows) == set(expected)
    for key, want in expected.items():
        row = rows[key]
        assert row["arms"]["ON"]["median"] == pytest.approx(want["ON"], abs=1e-6)
        assert row["arms"]["OFF"]["median"] == pytest.approx(want["OFF"], abs=1e-6)
        assert row["mean_change_pct"] == pytest.approx(want["mean_change"], abs=1e-6)
        assert row["matched_units"] == want["units"] == 4
        assert len(row["arms"]["ON"]["observations"]) == 4
        assert row["inference"]["mode"] == "descriptive"
        assert not {"wilcoxon_signed_rank_p", "sign_test_p"} & set(row["inference"])


def test_namespace_leak_excludes_the_whole_block(build_lite: Any) -> None:
    events, planted = generate(flaws=Flaws(namespace_leak=True))
    block = planted["namespace_leak"]
    report = derive_report(build_lite(events))
    per_block = sum(
        1
        for e in events
        if e["kind"] == "request.sent" and e["block_id"] == block and not e["data"]["warmup"]
    )
    assert report["accounting"]["excluded_blocks"] == [block]
    assert report["accounting"]["measured"] == 768 - per_block
    (ex,) = report["exclusions"]
    assert ex["block_id"] == block and ex["source"] == "namespace-leak" and "10976 local" in ex["reason"]
    # The partner block's requests are shown as excluded pairs, not silently dropped.
    assert report["pairing"]["counts"]["excluded"] == per_block


def test_unmatched_are_listed(build_lite: Any) -> None:
    events, _ = generate(flaws=Flaws(unpaired=True, gpu_mismatch=True))
    report = derive_report(build_lite(events))
    statuses = sorted(p["status"] for p in report["pairing"]["not_matched"])
    assert statuses == ["gpu-mismatch", "unpaired-on"]


def test_declared_exclusion_shown_with_reason(build_lite: Any) -> None:
    events, planted = generate(flaws=Flaws(declared_exclusion=True))
    report = derive_report(build_lite(events))
    (ex,) = report["exclusions"]
    assert ex == {
        "run_id": ex["run_id"],
        "block_id": planted["declared_exclusion"],
        "source": "declared",
        "reason": "host maintenance during block",
    }


def test_rank_tests_offered_only_with_six_block_pairs(build_lite: Any) -> None:
    events, _ = generate(shape=Shape(pairs=6, chains=1, sizes=(8192,), sessions=1))
    report = derive_report(build_lite(events))
    cross = next(r for r in report["tables"]["ttft"] if r["locality"] == "cross")
    inference = cross["inference"]
    assert inference["n_block_pairs"] == 6
    assert inference["mode"].startswith("exact rank tests")
    # All six pairs are faster ON: the exact two-sided minimum 2/2^6.
    assert inference["wilcoxon_signed_rank_p"] == inference["sign_test_p"] == 0.03125
    # Six values: the exact 95 % intervals are the extremes (attaining 1 − 2/64), around the
    # Hodges–Lehmann estimate (the median of the 21 Walsh averages of the per-pair changes).
    per_pair = inference["per_pair_change_pct"]
    walsh = sorted((a + b) / 2 for i, a in enumerate(per_pair) for b in per_pair[i:])
    assert inference["hodges_lehmann_change_pct"] == pytest.approx((walsh[10]), abs=1e-6)
    for ci in (inference["wilcoxon_ci"], inference["sign_ci"]):
        assert ci["level"] == 0.96875
        assert (ci["low"], ci["high"]) == (pytest.approx(min(per_pair)), pytest.approx(max(per_pair)))
    markdown = to_markdown(report)
    assert "Hodges–Lehmann" in markdown and "(exact Wilcoxon 96.9%)" in markdown
    assert "descriptive (6 block pairs)" not in markdown


def test_json_and_markdown_are_byte_identical_across_derivations(build_lite: Any, tmp_path: Path) -> None:
    events, _ = generate(flaws=Flaws(namespace_leak=True, declared_exclusion=True))
    first = build_lite(events)
    again = open_source(first.ledger, snapshot_root=tmp_path / "other-snapshot")
    try:
        a, b = derive_report(first), derive_report(again)
    finally:
        again.close()
    assert to_json(a) == to_json(b)
    assert to_markdown(a) == to_markdown(b)
    assert a["head"] == {"seq": len(events), "chain": first.ledger.head().chain}
    assert f"chain `{a['head']['chain']}`" in to_markdown(a)


def test_run_scope_restricts_tables(build_lite: Any) -> None:
    events, _ = generate(screenings=2)
    src = build_lite(events)
    runs = [
        e["run_id"] for e in events if e["kind"] == "run.started" and e["data"]["experiment"] == "screening"
    ]
    both = derive_report(src)
    one = derive_report(src, runs[1])
    assert both["accounting"]["measured"] == 2 * one["accounting"]["measured"] == 1536
    assert {r["run_id"] for r in one["tables"]["ttft"]} == {runs[1]}
    assert [r["run_id"] for r in one["runs"]] == [runs[1]]


def test_tables_are_built_already_rounded(build_lite: Any) -> None:
    """``derive_report`` does not re-walk the study tables (they are ``Clean``): every float in
    them must already be what ``_clean`` would make of it."""
    import orjson

    from reports._derive import _clean

    events, _ = generate(shape=Shape(pairs=6, chains=1, sizes=(8192,), sessions=1))
    tables = orjson.loads(orjson.dumps(derive_report(build_lite(events))["tables"]))  # Clean → list
    assert tables["ttft"] and tables["sessions"] and tables["decode"] and tables["windows"]
    assert _clean(tables) == tables
    floats = [v for row in tables["ttft"] for v in row["arms"]["ON"]["observations"]]
    assert floats and all(v == round(v, 6) for v in floats)


def test_repeated_keys_are_numbered_in_seq_order(build_lite: Any) -> None:
    """A measured request whose pairing key (run, pair, arm, workload, step, size, output length,
    placement, chain, session, window, turn) repeats gets ordinals 1, 2, ... in seq order, as a
    window over every measured row numbers them; a unique key gets 1."""
    events, _ = generate()
    measured = next(
        e
        for e in events
        if e["kind"] == "request.sent"
        and not e["data"].get("warmup")
        and e["data"].get("workload") == "micro"
    )
    at = events.index(measured) + 1
    repeats = []
    for n in range(2):
        copy = dict(measured, id=f"{measured['id'][:-4]}{n:04x}", data=dict(measured["data"]))
        copy["data"]["request_id"] = f"repeat-{n}"
        repeats.append(copy)
    src = build_lite(events[:at] + repeats + events[at:])
    keys = (
        "run_id, pair, arm, workload, step, nominal_tokens, max_tokens, placement, "
        'chain, session, "window", turn'
    )
    reference = src.tuples(
        f"SELECT seq, row_number() OVER (PARTITION BY {keys} ORDER BY seq) FROM kv_requests "
        "WHERE arm IS NOT NULL AND NOT warmup AND probe IS NULL ORDER BY seq"
    )
    assert src.tuples("SELECT seq, ordinal FROM kv_measured ORDER BY seq") == reference
    ordinals = src.tuples(
        "SELECT ordinal FROM kv_measured WHERE request_id IN ($first, 'repeat-0', 'repeat-1') ORDER BY seq",
        {"first": measured["data"]["request_id"]},
    )
    assert ordinals == [(1,), (2,), (3,)]

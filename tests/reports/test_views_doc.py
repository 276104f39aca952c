"""reports/VIEWS.md is current, and its SQL through `ledger sql` gives the report's numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ledger._cli import cli
from reports import derive_report, open_source
from reports._views import EXAMPLES, views_markdown, with_clause
from tests._synthetic import generate

from .conftest import import_envelopes


def test_views_md_is_generated_from_the_sql() -> None:
    path = Path(__file__).parents[2] / "reports" / "VIEWS.md"
    assert path.read_text(encoding="utf-8") == views_markdown(), "run: python -m reports.docs"


def _sql(url: str, query: str) -> list[dict[str, object]]:
    result = CliRunner().invoke(
        cli, ["sql", "--db", url, "--format", "json", with_clause(query)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def test_ledger_sql_reproduces_report_numbers(sqlite_url: str) -> None:
    events, _ = generate()
    led = import_envelopes(sqlite_url, events)
    src = open_source(led)
    report = derive_report(src)
    src.close()
    medians = _sql(sqlite_url, dict(EXAMPLES)["Table 3 medians (TTFT by size × locality × arm)"])
    for row in report["tables"]["ttft"]:
        for arm in ("ON", "OFF"):
            (hand,) = [
                m
                for m in medians
                if (m["nominal_tokens"], m["locality"], m["arm"])
                == (row["nominal_tokens"], row["locality"], arm)
            ]
            assert hand["median_ttft_s"] == pytest.approx(row["arms"][arm]["median"], abs=1e-6)
    changes = _sql(
        sqlite_url, dict(EXAMPLES)["Table 3 paired change (mean of 100 × (ON/OFF − 1) over matched chains)"]
    )
    for row in report["tables"]["ttft"]:
        (hand,) = [
            c
            for c in changes
            if (c["nominal_tokens"], c["locality"]) == (row["nominal_tokens"], row["locality"])
        ]
        assert hand["mean_change_pct"] == pytest.approx(row["mean_change_pct"], abs=1e-6)
    (acc,) = _sql(sqlite_url, dict(EXAMPLES)["Accounting: measured requests and pairs"])
    assert acc == {k: report["accounting"][k] for k in ("measured", "pairs", "matched_pairs")}

"""The static HTML report in headless Chromium: it loads, figures render, no console errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reports import derive_report
from reports._audit import audit_json
from reports._html import VERDICT_FINDINGS, to_html
from tests._synthetic import Flaws, generate

from ._chromium import chromium_binary, inspect_page


@pytest.fixture(autouse=True)
def _chromium_present() -> None:
    # A missing browser fails (scripts/test installs it), never skips the check.
    assert chromium_binary() is not None, "chromium missing: run scripts/ensure-chromium.sh"


def test_html_renders_figures_in_headless_chromium(build_lite: Any, tmp_path: Path) -> None:
    events, _ = generate(flaws=Flaws(declared_exclusion=True))
    html = to_html(derive_report(build_lite(events)))
    assert "<script" not in html and 'src="http' not in html and "<link" not in html  # self-contained
    page = tmp_path / "report.html"
    page.write_text(html, encoding="utf-8")
    seen = inspect_page(page, "figure.fig svg")
    assert seen["title"] == "kvledger report"
    assert seen["errors"] == []
    assert len(seen["sizes"]) == 3  # Figure 3, Figure 4, the paired dot plot
    assert all(w > 100 and h > 100 for w, h in seen["sizes"])


# What the page shows first, read by the browser: the verdict's gate, its links and where they lead.
_VERDICT = """(() => {
  const v = document.querySelector('#verdict');
  const ids = (sel) => [...document.querySelectorAll(sel)].map(a => a.getAttribute('href').slice(1));
  const finding = ids('#verdict ul.blocking a[href^="#finding-"]');
  const runs = ids('#verdict a[href^="#run-"]');
  const contents = ids('#contents a');
  return {
    first: document.querySelector('body > section, body > nav').id,
    gate: v.querySelector('.gate').className + ': ' + v.querySelector('.gate').textContent,
    text: v.textContent,
    findings: finding.map(id => document.getElementById(id)?.cells[1].textContent ?? null),
    runs: runs.map(id => document.getElementById(id) !== null),
    contents: contents.map(id => document.getElementById(id) !== null),
    audit_rows: document.querySelectorAll('#audit tbody tr').length,
    run_sections: document.querySelectorAll('section[id^="run-"]').length,
  };
})()"""


def test_html_opens_with_the_verdict_in_headless_chromium(build_lite: Any, tmp_path: Path) -> None:
    events, _ = generate(flaws=Flaws(counter_mismatch=True))
    src = build_lite(events)
    report, audit = derive_report(src), audit_json(src)
    blocking = [f for f in audit["findings"] if f["severity"] == "blocking"]
    assert blocking
    page = tmp_path / "report.html"
    page.write_text(to_html(report, audit), encoding="utf-8")
    seen = inspect_page(page, "#verdict", _VERDICT)
    assert seen["errors"] == [] and len(seen["sizes"]) == 1
    v = seen["value"]
    assert v["first"] == "verdict"
    assert v["gate"].startswith("gate blocked: Publish: NO") and f"{len(blocking)} blocking" in v["gate"]
    assert str(report["head"]["chain"]) in v["text"] and "Headline" in v["text"]
    # Each listed blocking finding links to its own row of the audit table, which names its code.
    assert v["findings"] == [f["code"] for f in blocking][:VERDICT_FINDINGS]
    assert v["runs"] and all(v["runs"])
    assert v["contents"] and all(v["contents"])
    assert v["audit_rows"] == len(audit["findings"])
    assert v["run_sections"] == len(report["runs"])


def test_html_verdict_of_a_clean_ledger_lets_it_publish(build_lite: Any, tmp_path: Path) -> None:
    events, _ = generate()
    src = build_lite(events)
    report, audit = derive_report(src), audit_json(src)
    assert not [f for f in audit["findings"] if f["severity"] == "blocking"]
    page = tmp_path / "report.html"
    page.write_text(to_html(report, audit), encoding="utf-8")
    v = inspect_page(page, "#verdict", _VERDICT)["value"]
    assert v["gate"].startswith("gate clear: Publish: yes") and v["findings"] == []
    for cell in report["headline"]:
        assert f"{cell['cross_s']:.3f}" in v["text"] and f"{cell['local_s']:.3f}" in v["text"]


def test_the_checker_sees_console_errors(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><title>bad</title><script>console.error('boom')</script>", encoding="utf-8"
    )
    assert inspect_page(page, "svg")["errors"]

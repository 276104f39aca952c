"""The static HTML report in headless Chromium: it loads, figures render, no console errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reports import derive_report
from reports._html import to_html
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


def test_the_checker_sees_console_errors(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><title>bad</title><script>console.error('boom')</script>", encoding="utf-8"
    )
    assert inspect_page(page, "svg")["errors"]

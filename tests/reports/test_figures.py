"""The figures as SVG text: one legend, plain log ticks labelled once, sizes in k, unique ids."""

from __future__ import annotations

import html
import re
from typing import Any

from reports import derive_report
from reports._html import figure_paired, figure_sessions, figure_ttft, to_html
from tests._synthetic import generate


def _texts(svg: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]


def test_figure_3_is_readable(build_lite: Any) -> None:
    events, _ = generate()
    report = derive_report(build_lite(events))
    texts = _texts(figure_ttft(report["tables"]["ttft"]))
    # One legend for the figure: each arm once, whatever the case of the data.
    assert texts.count("OFF") == texts.count("ON") == texts.count("median") == 1
    assert "off" not in texts and "on" not in texts
    titles = [t for t in texts if t.endswith("tokens")]
    assert titles == ["8k tokens", "32k tokens", "128k tokens", "256k tokens"]
    # A shared log axis in plain seconds, labelled once (on the left), never 2×10⁻¹.
    ticks = [t for t in texts if re.fullmatch(r"[0-9.]+", t)]
    assert ticks and len(ticks) == len(set(ticks))
    assert not [t for t in texts if "×" in t or "10^" in t or "mathdefault" in t]
    assert texts.count("TTFT (s, log scale)") == 1


def test_figure_4_and_paired_plot_are_labelled(build_lite: Any) -> None:
    events, _ = generate()
    report = derive_report(build_lite(events))
    texts = _texts(figure_sessions(report["tables"]["sessions"]))
    assert texts.count("OFF") == texts.count("ON") == 1
    assert {"32k-token start", "128k-token start"} <= set(texts)
    changes = {
        r["placement"]: r["mean_change_pct"]
        for r in report["tables"]["sessions"]
        if r["nominal_tokens"] == 131072
    }
    assert f"ON vs OFF {changes['alternating']:+.1f}%" in texts
    paired = _texts(figure_paired(report["tables"]["ttft"]))
    assert {"block pair 0", "block pair 1"} <= set(paired)
    assert sum(t == "block pair 0" for t in paired) == 1
    assert "first local reuse" in " ".join(paired)


def test_figure_ids_are_unique_per_run(build_lite: Any) -> None:
    events, _ = generate(screenings=2)
    page = to_html(derive_report(build_lite(events)))
    ids = re.findall(r"id='(fig-[^']+)'", page)
    assert len(ids) == 6 and len(set(ids)) == 6


def test_a_sessions_only_run_still_gets_figure_4(build_lite: Any) -> None:
    events, _ = generate()
    no_micro = {
        e["data"]["request_id"]
        for e in events
        if e["kind"] == "request.sent" and e["data"]["workload"] == "micro"
    }
    kept = [
        e
        for e in events
        if not (
            e["kind"] in ("request.sent", "response.received", "hits.observed", "assertion.evaluated")
            and e["data"].get("request_id") in no_micro
        )
    ]
    page = to_html(derive_report(build_lite(kept)))
    ids = re.findall(r"id='(fig-[a-z]+)-", page)
    assert ids == ["fig-sessions"]

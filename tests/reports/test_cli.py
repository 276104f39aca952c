"""`ledger report`, `ledger audit` and `ledger attest` through the CLI."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import NewEvent, open_ledger
from ledger._cli import cli
from tests._synthetic import Flaws, generate
from tests.ledger._helpers import tamper_sqlite

from .conftest import import_envelopes


def _ledger(sqlite_url: str, **flaws: bool) -> tuple[str, list[dict[str, Any]]]:
    events, _ = generate(flaws=Flaws(**flaws))
    import_envelopes(sqlite_url, events).close()
    return sqlite_url, events


def _run(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_report_json_and_markdown_are_stable(sqlite_url: str) -> None:
    url, events = _ledger(sqlite_url)
    first = _run("report", "--db", url, "--json")
    assert first.exit_code == 0
    assert _run("report", "--db", url, "--json").stdout == first.stdout
    report = json.loads(first.stdout)
    assert report["head"]["seq"] == len(events)
    assert report["accounting"]["measured"] == 768
    md = _run("report", "--db", url, "--markdown").stdout
    assert md == _run("report", "--db", url, "--markdown").stdout
    assert md.startswith("# kvledger report") and "Table 3" in md and "Table 2" in md


def test_report_html_and_terminal(sqlite_url: str, tmp_path: Path) -> None:
    url, _ = _ledger(sqlite_url)
    out = tmp_path / "r.html"
    assert _run("report", "--db", url, "--html", str(out)).exit_code == 0
    assert out.read_text().count("<svg") == 3
    terminal = _run("report", "--db", url)
    assert terminal.exit_code == 0 and "Accounting" in terminal.stdout


def test_unknown_run_is_bad_usage(sqlite_url: str) -> None:
    url, _ = _ledger(sqlite_url)
    assert _run("report", "--db", url, "--run", "nope").exit_code == 2


def test_audit_publish_gate(sqlite_url: str, tmp_path: Path) -> None:
    url, _ = _ledger(sqlite_url)
    clean = _run("audit", "--db", url, "--publish", "--json")
    assert clean.exit_code == 0
    body = json.loads(clean.stdout)
    assert set(body) == {"findings", "head"}
    bad_url = f"sqlite:///{tmp_path / 'bad.db'}"
    _ledger(bad_url, counter_mismatch=True)
    gated = _run("audit", "--db", bad_url, "--publish", "--json")
    assert gated.exit_code == 1
    assert "counter-mismatch" in {f["code"] for f in json.loads(gated.stdout)["findings"]}
    assert _run("audit", "--db", bad_url).exit_code == 0  # without --publish it only reports


def test_audit_terminal_groups_repeated_codes_and_json_keeps_every_instance(sqlite_url: str) -> None:
    url, events = _ledger(sqlite_url)
    requests = [e["data"]["request_id"] for e in events if e["kind"] == "request.sent"][:5]
    led = open_ledger(url)
    led.append_many(
        [
            NewEvent(
                "exclusion.declared",
                {"scope": "request", "target": r, "reason": f"r{i}"},
                run_id=events[0]["run_id"],
            )
            for i, r in enumerate(requests)
        ]
    )
    led.close()
    every = json.loads(_run("audit", "--db", url, "--json").stdout)["findings"]
    declared = [f for f in every if f["code"] == "declared-exclusion"]
    assert sorted(f["target"] for f in declared) == sorted(requests)
    shown = CliRunner().invoke(cli, ["audit", "--db", url], env={"COLUMNS": "250"}).stdout
    assert f"{len(every)} finding(s) of 2 code(s), 0 blocking" in shown
    assert "declared-exclusion ×5" in shown and "the first 3 follow (--json lists all)" in shown
    assert shown.count("  e.g.") == 3 and sum(r[:13] in shown for r in requests) == 3
    assert "assertion-not-independent" in shown  # a code found once is one plain row


def _keys(tmp_path: Path) -> tuple[Path, Path]:
    key = Ed25519PrivateKey.generate()
    priv, pub = tmp_path / "key.pem", tmp_path / "key.pub.pem"
    priv.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return priv, pub


def test_attest_sign_and_verify(sqlite_url: str, tmp_path: Path) -> None:
    url, events = _ledger(sqlite_url)
    run_id = next(
        e["run_id"] for e in events if e["kind"] == "run.started" and e["data"]["experiment"] == "screening"
    )
    priv, pub = _keys(tmp_path)
    out = tmp_path / "att" / "statement.json"
    made = _run("attest", "--db", url, "--run", run_id, "--out", str(out), "--key", str(priv))
    assert made.exit_code == 0, made.output
    envelope = json.loads(out.read_text())
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert {s["name"] for s in statement["subject"]} == {"report.json", "report.md"}
    pred = statement["predicate"]
    assert pred["ledger"]["head"]["seq"] == len(events) and pred["run_ids"] == [run_id]
    assert pred["audit"]["publishable"] is True and pred["configs"]
    ok = _run(
        "attest", "--db", url, "--verify", str(out), "--pubkey", str(pub), "--report-dir", str(out.parent)
    )
    assert ok.exit_code == 0, ok.output
    # The ledger grows: the statement still verifies at its attested head.
    led = open_ledger(url)
    led.append(NewEvent("note.added", {"text": "later"}))
    led.close()
    assert _run("attest", "--db", url, "--verify", str(out), "--pubkey", str(pub)).exit_code == 0
    # Another key, or an edited report file, fails.
    (tmp_path / "other").mkdir()
    _, other = _keys(tmp_path / "other")
    assert _run("attest", "--db", url, "--verify", str(out), "--pubkey", str(other)).exit_code == 1
    (out.parent / "report.md").write_text("edited")
    assert (
        _run(
            "attest", "--db", url, "--verify", str(out), "--pubkey", str(pub), "--report-dir", str(out.parent)
        ).exit_code
        == 1
    )


def test_attest_unsigned_detects_a_different_ledger(sqlite_url: str, tmp_path: Path) -> None:
    url, events = _ledger(sqlite_url)
    run_id = events[-1]["run_id"]
    out = tmp_path / "s.json"
    assert _run("attest", "--db", url, "--run", run_id, "--out", str(out)).exit_code == 0
    assert _run("attest", "--db", url, "--verify", str(out)).exit_code == 0
    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    _ledger(other_url, assertion_failed=True)
    assert _run("attest", "--db", other_url, "--verify", str(out)).exit_code == 1


@pytest.mark.parametrize("command", ["report", "audit", "attest"])
def test_help_has_an_example(command: str) -> None:
    result = _run(command, "--help")
    assert result.exit_code == 0 and "Example" in result.output


def test_attest_verify_fails_on_a_tampered_ledger(sqlite_url: str, tmp_path: Path) -> None:
    url, events = _ledger(sqlite_url)
    run_id = next(
        e["run_id"] for e in events if e["kind"] == "run.started" and e["data"]["experiment"] == "screening"
    )
    out = tmp_path / "s.json"
    assert _run("attest", "--db", url, "--run", run_id, "--out", str(out)).exit_code == 0
    assert _run("attest", "--db", url, "--verify", str(out)).exit_code == 0  # the snapshot is now warm
    # Edit one stored note-like event the report does not read: only the chain can tell.
    tamper_sqlite(
        url,
        [
            'UPDATE events SET data = replace(data, \'"phase":"before"\', '
            '\'"phase":"after"\') '
            "WHERE seq = (SELECT min(seq) FROM events WHERE kind = 'metrics.scraped')"
        ],
    )
    result = _run("attest", "--db", url, "--verify", str(out))
    assert result.exit_code == 1
    assert "hash chain does not verify" in result.output

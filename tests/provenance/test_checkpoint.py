"""Checkpoint audit: hashes, manifests, Hugging Face snapshots, stability, the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
from pathlib import Path

from click.testing import CliRunner

from collectors._checkpoint import audit_checkpoint, manifest_hashes
from ledger import open_ledger
from ledger._cli import cli


def _make_checkpoint(root: Path) -> dict[str, str]:
    root.mkdir(parents=True, exist_ok=True)
    files = {
        "config.json": b'{"hidden": 128}',
        "model.safetensors": os.urandom(3 << 20),
        "sub/tokenizer.json": b"{}",
    }
    hashes = {}
    for name, payload in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(payload)
        hashes[name] = hashlib.sha256(payload).hexdigest()
    return hashes


def test_hashes_match_a_json_manifest(tmp_path: Path) -> None:
    hashes = _make_checkpoint(tmp_path / "ck")
    (tmp_path / "manifest.json").write_text(json.dumps(hashes))
    audit = audit_checkpoint(tmp_path / "ck", "rev1", tmp_path / "manifest.json")
    assert audit.matched is True and audit.stable is True
    assert {f.name: f.sha256 for f in audit.files} == hashes
    assert sum(f.bytes for f in audit.files) == (3 << 20) + len(b'{"hidden": 128}') + 2


def test_one_changed_byte_is_a_mismatch(tmp_path: Path) -> None:
    hashes = _make_checkpoint(tmp_path / "ck")
    (tmp_path / "SHA256SUMS").write_text("".join(f"{h}  {n}\n" for n, h in hashes.items()))
    with open(tmp_path / "ck" / "model.safetensors", "r+b") as f:
        f.seek(1 << 20)
        byte = f.read(1)
        f.seek(1 << 20)
        f.write(bytes([byte[0] ^ 1]))
    audit = audit_checkpoint(tmp_path / "ck", manifest=tmp_path / "SHA256SUMS")
    assert audit.matched is False
    bad = [f.name for f in audit.files if f.sha256 != f.expected_sha256]
    assert bad == ["model.safetensors"]
    assert manifest_hashes(tmp_path / "SHA256SUMS") == hashes


def test_a_file_growing_while_read_is_unstable(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    root.mkdir()
    target = root / "model.bin"
    target.write_bytes(os.urandom(32 << 20))
    done = threading.Event()

    def writer() -> None:
        with open(target, "ab") as out:
            while not done.is_set():
                out.write(b"x")
                out.flush()
                done.wait(0.0005)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        audits = [audit_checkpoint(root) for _ in range(5)]
    finally:
        done.set()
        thread.join()
    assert any(not a.stable for a in audits)


def test_manifest_from_sha256sum_in_the_directory(tmp_path: Path) -> None:
    """`cd DIR && sha256sum $(find . -type f)` names files ./x: the prefix is dropped."""
    hashes = _make_checkpoint(tmp_path / "ck")
    lines = subprocess.run(
        "find . -type f | sort | xargs sha256sum",
        shell=True,
        cwd=tmp_path / "ck",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (tmp_path / "SHA256SUMS").write_text(lines)
    assert manifest_hashes(tmp_path / "SHA256SUMS") == hashes
    audit = audit_checkpoint(tmp_path / "ck", manifest=tmp_path / "SHA256SUMS")
    assert audit.matched is True and audit.problems == []


def test_a_file_the_manifest_lists_but_the_directory_lacks_is_missing(tmp_path: Path) -> None:
    hashes = _make_checkpoint(tmp_path / "ck")
    (tmp_path / "ck" / "sub" / "tokenizer.json").unlink()
    (tmp_path / "m.json").write_text(json.dumps(hashes))
    audit = audit_checkpoint(tmp_path / "ck", manifest=tmp_path / "m.json")
    assert audit.matched is False and audit.missing == ["sub/tokenizer.json"]
    assert audit.problems == ["sub/tokenizer.json: missing"]


def test_no_reference_is_unverified_and_says_how_to_supply_one(tmp_path: Path) -> None:
    _make_checkpoint(tmp_path / "ck")
    audit = audit_checkpoint(tmp_path / "ck")
    assert audit.matched is None and audit.reference is None
    (problem,) = audit.problems
    assert "ledger checkpoint manifest" in problem and "--manifest" in problem


def test_cli_records_the_audit_and_exits_1_on_mismatch(tmp_path: Path) -> None:
    hashes = _make_checkpoint(tmp_path / "ck")
    hashes["config.json"] = "0" * 64
    (tmp_path / "m.json").write_text(json.dumps(hashes))
    url = f"sqlite:///{tmp_path / 'l.db'}"
    result = CliRunner().invoke(
        cli,
        [
            "checkpoint",
            "audit",
            str(tmp_path / "ck"),
            "--manifest",
            str(tmp_path / "m.json"),
            "--db",
            url,
            "--json",
        ],
    )
    assert result.exit_code == 1, result.output
    (event,) = open_ledger(url).events(kind="checkpoint.audited")
    assert event.data["matched"] is False and event.data["stable"] is True
    missing = CliRunner().invoke(cli, ["checkpoint", "audit", str(tmp_path / "nope"), "--db", url])
    assert missing.exit_code == 2

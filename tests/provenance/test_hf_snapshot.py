"""Hugging Face hub cache snapshots: LFS files checked by SHA-256, the others by git blob SHA-1.

The snapshots here have the hub cache's real layout, as ``huggingface_hub``
writes it::

    models--ORG--NAME/
      blobs/<sha256 of an LFS file>          the bytes, named by the hub's ETag
      blobs/<git blob SHA-1 of a small file>
      refs/main                              the commit the snapshot is of
      snapshots/<commit>/model.safetensors -> ../../blobs/<sha256>
      snapshots/<commit>/config.json       -> ../../blobs/<sha1>
      snapshots/<commit>/tokenizer/tokenizer.json -> ../../../blobs/<sha1>

The expected git SHA-1s come from ``git hash-object``, not from the code under test.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from collectors._checkpoint import audit_checkpoint, git_blob_sha1, hf_snapshot_hashes
from ledger import NewEvent, open_ledger
from ledger._cli import cli
from reports import audit, open_source

COMMIT = "7a6d2e0f5c1b4a3e9d8c7b6a5f4e3d2c1b0a9f8e"


@pytest.fixture(autouse=True)
def _snapshot_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVLEDGER_CACHE", str(tmp_path / "cache"))


def _safetensors(tensors: dict[str, int]) -> bytes:
    """A valid safetensors file: 8-byte header length, JSON header, F32 data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset, data = 0, b""
    for name, count in tensors.items():
        payload = os.urandom(4 * count)
        header[name] = {"dtype": "F32", "shape": [count], "data_offsets": [offset, offset + len(payload)]}
        offset += len(payload)
        data += payload
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + data


def _git_hash_object(payload: bytes) -> str:
    return (
        subprocess.run(["git", "hash-object", "--stdin"], input=payload, capture_output=True, check=True)
        .stdout.decode()
        .strip()
    )


@dataclass
class Snapshot:
    repo: Path
    path: Path
    blobs: dict[str, Path]  # file name in the snapshot -> its blob


def make_snapshot(cache: Path) -> Snapshot:
    repo = cache / "hub" / "models--kvledger--tiny-llama"
    snap = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    files = {
        "model.safetensors": (_safetensors({"embed.weight": 1 << 18, "lm_head.weight": 1 << 18}), True),
        "config.json": (
            json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}).encode(),
            False,
        ),
        "tokenizer/tokenizer.json": (
            json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}}}).encode(),
            False,
        ),
        "generation_config.json": (b"", False),  # an empty git file has a blob SHA-1 too
    }
    blobs = {}
    for name, (payload, lfs) in files.items():
        blob = hashlib.sha256(payload).hexdigest() if lfs else _git_hash_object(payload)
        (repo / "blobs" / blob).write_bytes(payload)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        up = "../" * (len(Path(name).parts) + 1)
        link.symlink_to(f"{up}blobs/{blob}")
        blobs[name] = repo / "blobs" / blob
    return Snapshot(repo, snap, blobs)


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))


def test_references_by_kind(tmp_path: Path) -> None:
    snap = make_snapshot(tmp_path)
    refs = hf_snapshot_hashes(snap.path)
    assert {n: kind for n, (kind, _) in refs.items()} == {
        "model.safetensors": "sha256",
        "config.json": "git-sha1",
        "tokenizer/tokenizer.json": "git-sha1",
        "generation_config.json": "git-sha1",
    }
    config = snap.blobs["config.json"]
    assert git_blob_sha1(config) == _git_hash_object(config.read_bytes()) == config.name


def test_a_correct_snapshot_matches(tmp_path: Path) -> None:
    snap = make_snapshot(tmp_path)
    result = audit_checkpoint(snap.path)
    assert result.matched is True and result.stable and result.problems == []
    assert result.reference == "hf-cache-snapshot" and result.revision == COMMIT
    by_name = {f.name: f for f in result.files}
    assert by_name["model.safetensors"].expected_sha256 == snap.blobs["model.safetensors"].name
    assert (
        by_name["config.json"].expected_git_sha1
        == by_name["config.json"].git_sha1
        == snap.blobs["config.json"].name
    )
    assert by_name["model.safetensors"].git_sha1 is None  # LFS files are not hashed twice


def test_a_folder_inside_the_snapshot_takes_the_snapshot_revision(tmp_path: Path) -> None:
    snap = make_snapshot(tmp_path)
    result = audit_checkpoint(snap.path / "tokenizer")
    assert result.matched is True and result.revision == COMMIT
    assert [f.name for f in result.files] == ["tokenizer.json"]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("model.safetensors", "SHA-256"),
        ("config.json", "git blob SHA-1"),
        ("tokenizer/tokenizer.json", "git blob SHA-1"),
    ],
)
def test_a_flipped_byte_is_named(tmp_path: Path, name: str, kind: str) -> None:
    snap = make_snapshot(tmp_path)
    _flip(snap.blobs[name], snap.blobs[name].stat().st_size // 2)
    result = audit_checkpoint(snap.path)
    assert result.matched is False
    assert result.problems == [f"{name}: {kind} differs"]
    url = f"sqlite:///{tmp_path / 'l.db'}"
    cli_result = CliRunner().invoke(cli, ["checkpoint", "audit", str(snap.path), "--db", url])
    assert cli_result.exit_code == 1
    assert f"problem: {name}: {kind} differs" in cli_result.output
    src = open_source(url)
    try:
        findings = [f for f in audit(src) if f.code.startswith("checkpoint-")]
    finally:
        src.close()
        src.ledger.close()
    assert [(f.code, f.severity) for f in findings] == [("checkpoint-mismatch", "blocking")]
    assert findings[0].detail == f"revision {COMMIT}: differs for {name} ({kind})"


def test_a_deleted_blob_is_missing(tmp_path: Path) -> None:
    snap = make_snapshot(tmp_path)
    snap.blobs["config.json"].unlink()  # the link dangles
    result = audit_checkpoint(snap.path)
    assert result.matched is False and result.missing == ["config.json"]
    assert result.problems == ["config.json: missing"]


def test_a_plain_file_in_a_snapshot_has_no_reference(tmp_path: Path) -> None:
    snap = make_snapshot(tmp_path)
    (snap.path / "extra.py").write_text("import os\n")
    result = audit_checkpoint(snap.path)
    assert result.matched is False and result.problems == ["extra.py: not in the reference"]


def test_unverified_blocks_publish_until_a_manifest_is_given(tmp_path: Path) -> None:
    ck = tmp_path / "model"
    ck.mkdir()
    (ck / "config.json").write_text("{}")
    (ck / "model.safetensors").write_bytes(_safetensors({"w": 1024}))
    url = f"sqlite:///{tmp_path / 'l.db'}"
    runner = CliRunner()
    first = runner.invoke(cli, ["checkpoint", "audit", str(ck), "--db", url])
    assert first.exit_code == 1
    assert "unverified: no reference to check against" in first.output
    published = runner.invoke(cli, ["audit", "--publish", "--json", "--db", url])
    assert published.exit_code == 1, published.output
    (found,) = [f for f in json.loads(published.output)["findings"] if f["code"].startswith("checkpoint-")]
    assert found["code"] == "checkpoint-unverified" and found["severity"] == "blocking"
    for words in (
        "ledger checkpoint manifest DIR > MANIFEST.json",
        "JSON {file: sha256}",
        "--manifest MANIFEST.json",
    ):
        assert words in found["detail"]
    # The remedy the message names works: a manifest made on a trusted copy verifies the files.
    made = runner.invoke(cli, ["checkpoint", "manifest", str(ck), "-o", str(tmp_path / "MANIFEST.json")])
    assert made.exit_code == 0, made.output
    manifest = json.loads((tmp_path / "MANIFEST.json").read_text())
    assert manifest["config.json"] == hashlib.sha256(b"{}").hexdigest()
    second = runner.invoke(
        cli,
        [
            "checkpoint",
            "audit",
            str(ck),
            "--manifest",
            str(tmp_path / "MANIFEST.json"),
            "--db",
            url,
            "--json",
        ],
    )
    assert second.exit_code == 0 and json.loads(second.output)["matched"] is True
    led = open_ledger(url)
    assert [e.data["matched"] for e in led.events(kind="checkpoint.audited")] == [None, True]
    led.close()


def test_a_malformed_manifest_is_refused_and_nothing_recorded(tmp_path: Path) -> None:
    ck = tmp_path / "model"
    ck.mkdir()
    (ck / "config.json").write_text("{}")
    (tmp_path / "bad.txt").write_text("not-a-digest  config.json\n")
    url = f"sqlite:///{tmp_path / 'l.db'}"
    open_ledger(url).append(NewEvent("note.added", {"text": "before"}))
    result = CliRunner().invoke(
        cli, ["checkpoint", "audit", str(ck), "--manifest", str(tmp_path / "bad.txt"), "--db", url]
    )
    assert result.exit_code == 2 and "line 1 is not 'SHA256  NAME'" in result.output
    assert [e.kind for e in open_ledger(url).events()] == ["note.added"]

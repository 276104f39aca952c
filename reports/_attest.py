"""Attestation: an in-toto Statement v1 binding report files to the ledger head.

Subjects are the report files (``report.json``, ``report.md``) with their
SHA-256 digests; the predicate holds the ledger head, run ids, checkpoint and
config digests, package versions and the audit result. Signing is optional:
Ed25519 (``cryptography``) over DSSE's pre-authentication encoding.
Verification re-derives the reports at the attested head and compares digests,
so a statement cannot outlive an edit to the ledger or to the report code's
output.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from ._audit import BLOCKING, audit_json
from ._derive import derive_report
from ._render import to_json, to_markdown
from ._source import Source

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://kvledger.dev/attestation/report/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"


def report_files(src: Source, run: str | None) -> dict[str, bytes]:
    """The attested files, derived from ``src`` (byte-identical for one head)."""
    report = derive_report(src, run)
    return {"report.json": to_json(report).encode(), "report.md": to_markdown(report).encode()}


def _provenance(src: Source, run: str | None) -> dict[str, Any]:
    p = {"run": run}
    runs = src.rows(
        "SELECT run_id, experiment, CAST(packages AS VARCHAR) AS packages, code_commit FROM kv_runs "
        "WHERE $run IS NULL OR run_id = $run ORDER BY seq",
        p,
    )
    configs = src.rows(
        "SELECT DISTINCT config_sha256 FROM kv_launches WHERE ($run IS NULL OR run_id = $run) "
        "AND config_sha256 IS NOT NULL ORDER BY 1",
        p,
    )
    checkpoints = src.rows(
        "SELECT path, revision, files FROM kv_checkpoints WHERE $run IS NULL OR run_id = $run ORDER BY seq", p
    )
    return {
        "run_ids": [r["run_id"] for r in runs],
        "code": {r["run_id"]: r["code_commit"] for r in runs},
        "packages": {r["run_id"]: json.loads(r["packages"] or "null") for r in runs},
        "configs": [r["config_sha256"] for r in configs],
        "checkpoints": [
            {
                "path": c["path"],
                "revision": c["revision"],
                "files": [
                    {"name": f.get("name"), "sha256": f.get("sha256")}
                    for f in json.loads(c["files"] or "[]")
                    if isinstance(f, dict)
                ],
            }
            for c in checkpoints
        ],
    }


def build_statement(src: Source, run: str | None, files: dict[str, bytes]) -> dict[str, Any]:
    audit = audit_json(src, run)
    codes: dict[str, int] = {}
    for f in audit["findings"]:
        key = f"{f['code']} ({f['severity']})"
        codes[key] = codes.get(key, 0) + 1
    blocking = sum(f["severity"] == BLOCKING for f in audit["findings"])
    head = {"seq": src.head.seq, "chain": src.head.chain} if src.head else None
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": name, "digest": {"sha256": hashlib.sha256(data).hexdigest()}}
            for name, data in sorted(files.items())
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "ledger": {"head": head},
            "scope": {"run": run},
            **_provenance(src, run),
            "audit": {"blocking": blocking, "publishable": blocking == 0, "findings": codes},
        },
    }


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()


def sign(statement: dict[str, Any], key_pem: bytes) -> dict[str, Any]:
    """A DSSE envelope carrying ``statement``, signed with an Ed25519 private key (PEM)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("the key must be an Ed25519 private key (PEM)")
    payload = canonical(statement)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    sig = key.sign(pae(PAYLOAD_TYPE, payload))
    return {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": key_id(raw), "sig": base64.b64encode(sig).decode()}],
    }


def open_envelope(doc: dict[str, Any], pubkey_pem: bytes | None) -> tuple[dict[str, Any], list[str]]:
    """The statement inside ``doc`` and the problems with its signature (empty when good)."""
    if "payloadType" not in doc:
        return doc, (["the statement is not signed"] if pubkey_pem else [])
    payload = base64.b64decode(doc["payload"])
    statement = json.loads(payload)
    if pubkey_pem is None:
        return statement, ["signed statement: give --pubkey to check the signature"]
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    key = serialization.load_pem_public_key(pubkey_pem)
    if not isinstance(key, Ed25519PublicKey):
        return statement, ["the public key is not Ed25519"]
    for s in doc.get("signatures", []):
        try:
            key.verify(base64.b64decode(s["sig"]), pae(doc["payloadType"], payload))
            return statement, []
        except (InvalidSignature, KeyError, ValueError):
            continue
    return statement, ["no signature verifies with the given public key"]


def _stored_chain(src: Source, seq: int) -> str | None:
    """The chain the database itself holds at ``seq`` (not the snapshot's copy)."""
    rows = list(src.ledger.raw_rows(after_seq=seq - 1, until_seq=seq))
    return str(rows[0][8]) if rows else None


def check_statement(statement: dict[str, Any], src: Source, report_dir: Path | None = None) -> list[str]:
    """Problems found re-deriving ``statement`` from ``src`` (opened at the attested head)."""
    problems = []
    if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != PREDICATE_TYPE:
        problems.append("not a kvledger in-toto statement")
        return problems
    pred = statement["predicate"]
    head = pred["ledger"]["head"]
    if head and (
        src.head is None
        or src.head.seq != head["seq"]
        or src.head.chain != head["chain"]
        or _stored_chain(src, int(head["seq"])) != head["chain"]
    ):
        problems.append(f"the ledger has no event seq {head['seq']} with chain {head['chain']}")
        return problems
    files = report_files(src, pred["scope"]["run"])
    for subject in statement["subject"]:
        name, want = subject["name"], subject["digest"]["sha256"]
        got = hashlib.sha256(files.get(name, b"")).hexdigest()
        if got != want:
            problems.append(f"{name}: re-derived digest {got} differs from attested {want}")
        if report_dir is not None and (report_dir / name).exists():
            on_disk = hashlib.sha256((report_dir / name).read_bytes()).hexdigest()
            if on_disk != want:
                problems.append(f"{report_dir / name}: file digest {on_disk} differs from attested {want}")
    fresh = build_statement(src, pred["scope"]["run"], files)["predicate"]
    broken = [code for code in fresh["audit"]["findings"] if code.startswith("chain-broken")]
    if broken:
        problems.append("the ledger's hash chain does not verify (ledger verify names the first bad seq)")
    for key in ("run_ids", "configs", "checkpoints", "packages", "audit"):
        if fresh.get(key) != pred.get(key):
            problems.append(f"predicate.{key} does not match the ledger")
    return problems

"""``hash-seed-unset``: ON replicas without one common recorded PYTHONHASHSEED, planted in a real sim run."""

from __future__ import annotations

from pathlib import Path

from reports import audit, open_source

from .._cli import ledger_cli

SMALL = [
    "--param",
    "size=2000",
    "--param",
    "reverse_size=1000",
    "--param",
    "session_size=1000",
    "--param",
    "sessions=1",
    "--param",
    "session_turns=1",
]


def _validation(tmp_path: Path, name: str, *extra: str) -> list[dict[str, object]]:
    url = f"sqlite:///{tmp_path / name}"
    result = ledger_cli("run", "validation", "--target", "sim", "--no-progress", "--db", url, *SMALL, *extra)
    assert result.exit_code == 0, result.output
    src = open_source(url)
    try:
        launches = src.rows("SELECT hash_seed FROM kv_launches ORDER BY seq")
        findings = [f.as_dict() for f in audit(src) if f.code == "hash-seed-unset"]
    finally:
        src.close()
    return [{"launch_seeds": [r["hash_seed"] for r in launches]}, *findings]


def test_replicas_without_a_seed_block_publishing(tmp_path: Path) -> None:
    clean = _validation(tmp_path, "clean.db")
    assert clean == [{"launch_seeds": ["0", "0"]}]
    unset = _validation(tmp_path, "unset.db", "--param", "hash_seed=null")
    assert unset[0] == {"launch_seeds": [None, None]}
    (found,) = unset[1:]
    assert found["severity"] == "blocking" and "(unset)" in str(found["detail"])

"""The Parquet snapshot is proven before a report reads it: every kind of tampered cache file
gives either the identical report or a blocking ``snapshot-mismatch`` naming the file (here the
report is rebuilt from the ledger and is identical *and* the audit blocks), never a changed number."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from ledger import Analytics, Ledger, open_ledger, read_jsonl
from ledger._snapshot import Proof, file_sha256
from reports import audit_json, derive_report, open_source, to_json
from reports._views import projections
from tests._cli import ledger_cli
from tests._synthetic import generate
from tests.ledger._helpers import tamper_postgres, tamper_sqlite


@pytest.fixture
def ledger(ledger_url: str, tmp_path: Path) -> Iterator[Ledger]:
    """A synthetic screening ledger appended in two parts, so its snapshot has two segments."""
    events, _ = generate()
    led = open_ledger(ledger_url)
    half = len(events) // 2
    led.append_sealed(read_jsonl(iter(orjson.dumps(e) for e in events[:half])))
    _proven(led, tmp_path / "snapshots")  # the first segment
    led.append_sealed(read_jsonl(iter(orjson.dumps(e) for e in events[half:])))
    yield led
    led.close()


def _proven(led: Ledger, root: Path) -> Proof:
    """The proof a reader of the snapshot at ``root`` makes as it opens (refreshing it, rebuilding
    what fails), without the report views a reader builds after it."""
    analytics = Analytics(led, root, projections())
    try:
        analytics.connection()
        return analytics.proof
    finally:
        analytics.close()


def _derive(led: Ledger, root: Path) -> tuple[str, list[dict[str, Any]], Path]:
    """The report JSON and the audit's findings as ``ledger attest`` derives them (verified)."""
    src = open_source(led, root, verify=True)
    try:
        return to_json(derive_report(src)), audit_json(src)["findings"], src.analytics.snapshot.directory
    finally:
        src.close()


def _mismatches(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in findings if f["code"] == "snapshot-mismatch"]


def _others(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in findings if f["code"] != "snapshot-mismatch"]


def _state(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "state.json").read_text()))


def _write_state(folder: Path, state: dict[str, Any]) -> None:
    (folder / "state.json").write_text(json.dumps(state))


def _is_responses(path: Path) -> bool:
    """A projection file of response.received (import.request has a ttft_s too, but no status)."""
    names = pq.read_schema(path).names
    return "ttft_s" in names and "status" in names


def _halve(path: Path, column: str | None = None) -> str:
    """Rewrite a Parquet file with one numeric column halved (its metadata kept); the column."""
    table = pq.read_table(path)
    numeric = [
        f.name
        for f in table.schema
        if pa.types.is_floating(f.type) or (pa.types.is_integer(f.type) and f.name != "seq")
    ]
    name = column or (numeric[0] if numeric else None)
    if name is None:  # no number to halve: change a text instead
        name = next(f.name for f in table.schema if pa.types.is_string(f.type))
        changed = pc.binary_join_element_wise(table.column(name), pa.scalar("x"), "")
    else:
        # Divided in its own type: an unsigned column (a series hash) may hold values above int64's.
        column_type = table.schema.field(name).type
        changed = pc.divide(table.column(name), pa.scalar(2, column_type)).cast(column_type)
    table = table.set_column(table.schema.get_field_index(name), name, changed)
    pq.write_table(table, path, compression="zstd")
    return name


def _halve_ttft_in_raw(path: Path) -> None:
    """Halve ``ttft_s`` in the data of every response in a raw segment (the digests kept)."""
    table = pq.read_table(path)
    data = [
        json.dumps({**d, "ttft_s": d["ttft_s"] / 2}) if "ttft_s" in d else text
        for text, d in ((t, json.loads(t)) for t in table.column("data").to_pylist())
    ]
    table = table.set_column(table.schema.get_field_index("data"), "data", pa.array(data, pa.string()))
    pq.write_table(table, path, compression="zstd")


def _halve_at(name: str, folder: Path) -> None:
    _halve(folder / name)


def _halve_ttft_at(name: str, folder: Path) -> None:
    _halve_ttft_in_raw(folder / name)


def test_every_tampered_cache_file_is_rebuilt_and_named(
    ledger: Ledger, ledger_url: str, tmp_path: Path
) -> None:
    pristine = tmp_path / "snapshots"
    clean, clean_findings, folder = _derive(ledger, pristine)
    assert _mismatches(clean_findings) == []
    state = _state(folder)
    segments = [s["name"] for s in state["segments"]]
    assert len(segments) == 2 and all(len(s["sha256"]) == 64 for s in state["segments"])
    projections = sorted(str(p.relative_to(folder)) for p in folder.glob("projection-*/*.parquet"))
    assert len(projections) >= 2 * 10  # every extracted kind, per segment
    cases = iter(range(1000))

    def case(tamper: Callable[[Path], Any], named: str | None) -> None:
        """Tamper with a copy of the clean two-segment snapshot, then derive over it."""
        root = tmp_path / f"case-{next(cases)}"
        shutil.copytree(pristine, root)
        tamper(root / folder.name)
        report, findings, _ = _derive(ledger, root)
        assert report == clean, "a tampered cache changed the report"
        assert _others(findings) == _others(clean_findings)
        found = _mismatches(findings)
        if named is None:
            assert found == []
        else:
            assert [(f["severity"], f["target"]) for f in found] == [("blocking", named)], found
        again = _proven(ledger, root)  # rebuilt: the next reader finds it proven
        assert again.mismatches == [] and again.files > 2
        shutil.rmtree(root)

    def edit_state(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
        def tamper(at: Path) -> None:
            s = _state(at)
            change(s)
            _write_state(at, s)

        return tamper

    # Each projection, one file at a time (each of the second segment, one of the first): a number
    # in it halved.
    # (PostgreSQL: two of them; the proof reads the database the same way for every file.)
    tampered = [p for p in projections if p.endswith(segments[1])] + [projections[0]]
    for name in tampered if ledger_url.startswith("sqlite") else tampered[:1] + tampered[-1:]:
        case(partial(_halve_at, name), name)
    # Each raw segment: ttft_s halved in the JSON of every response.
    for name in segments:
        case(partial(_halve_ttft_at, name), name)
    # The state file: a segment's digest, a projection file's digest, the order of the segments.
    first, second, projection = segments[0], segments[1], Path(projections[0])
    case(edit_state(lambda s: s["segments"][0].update(sha256="0" * 64)), first)
    case(
        edit_state(
            lambda s: s["projections"][projection.parent.name.removeprefix("projection-")]["files"][
                projection.name
            ].update(sha256="0" * 64)
        ),
        str(projection),
    )
    case(edit_state(lambda s: s["segments"].reverse()), second)
    # An extra segment listed after the last (a copy of it): it does not tile.
    extra = "events-999999999998-999999999999.parquet"

    def listed_extra(at: Path) -> None:
        shutil.copy(at / second, at / extra)
        edit_state(lambda s: s["segments"].append({"name": extra, "sha256": s["segments"][1]["sha256"]}))(at)

    case(listed_extra, extra)
    # Nothing served differed from the ledger: rebuilt without a finding.
    case(lambda at: shutil.copy(at / second, at / extra), None)  # an extra segment, not listed
    case(lambda at: (at / first).unlink(), None)  # a deleted segment
    case(lambda at: (at / second).unlink(), None)
    case(lambda at: (at / projection).unlink(), None)  # a deleted projection file
    case(lambda at: (at / "state.json").unlink(), None)
    case(lambda at: (at / "state.json").write_text("{not json"), None)
    case(edit_state(lambda s: s["segments"].pop()), None)  # the last segment forgotten


def test_plain_report_rebuilds_a_tampered_projection_quietly(ledger: Ledger, tmp_path: Path) -> None:
    root = tmp_path / "snapshots"
    src = open_source(ledger, root)
    clean = to_json(derive_report(src))
    folder = src.analytics.snapshot.directory
    src.close()
    responses = [p for p in folder.glob("projection-*/*.parquet") if _is_responses(p)]
    assert responses
    for path in responses:
        _halve(path, "ttft_s")
    src = open_source(ledger, root)
    try:
        assert to_json(derive_report(src)) == clean
        assert {m.file for m in src.snapshot_mismatches} == set(responses)
        assert src.snapshot_proof.files >= len(responses) and src.snapshot_proof.cpu_seconds > 0
    finally:
        src.close()


def test_rows_that_failed_their_check_when_written_are_read_again(
    ledger: Ledger, ledger_url: str, tmp_path: Path
) -> None:
    """A row edited in the database, snapshotted, then restored: the segment was marked unproven
    when written, so it is never served again once the ledger is whole."""
    root = tmp_path / "snapshots"
    clean, _, folder = _derive(ledger, root)
    with ledger.database.connect() as conn:
        seq, data = conn.exec_driver_sql(
            "SELECT seq, data FROM events WHERE kind = 'response.received' ORDER BY seq DESC LIMIT 1"
        ).one()
    tamper = tamper_sqlite if ledger_url.startswith("sqlite") else tamper_postgres
    forged = json.dumps({**json.loads(data), "ttft_s": 0.001}, separators=(",", ":"), sort_keys=True)
    shutil.rmtree(folder)
    tamper(ledger_url, [f"UPDATE events SET data = '{forged}' WHERE seq = {seq}"])
    open_source(ledger, root).close()  # a plain reader snapshots the edited row (a verified one builds none)
    src = open_source(ledger, root, verify=True)
    try:  # the broken ledger is served as it is, and the audit names the row
        assert src.scalar(f"SELECT data FROM events WHERE seq = {seq}") == forged
        assert [f["target"] for f in audit_json(src)["findings"] if f["code"] == "chain-broken"] == [str(seq)]
    finally:
        src.close()
    original = data.replace("'", "''")
    tamper(ledger_url, [f"UPDATE events SET data = '{original}' WHERE seq = {seq}"])
    report, findings, _ = _derive(ledger, root)
    assert report == clean and not any(f["code"] in ("chain-broken", "snapshot-mismatch") for f in findings)


def test_audit_publish_blocks_on_a_halved_ttft_projection(sqlite_url: str, tmp_path: Path) -> None:
    """The reported failure: ttft_s halved in one projection file, `ledger audit --publish`."""
    events, _ = generate()
    led = open_ledger(sqlite_url)
    led.append_sealed(read_jsonl(iter(orjson.dumps(e) for e in events)))
    led.close()
    before = ledger_cli("report", "--db", sqlite_url, "--json").stdout
    assert ledger_cli("audit", "--db", sqlite_url, "--publish").exit_code == 0
    cache = tmp_path / "cache" / "snapshots"
    (path,) = [p for p in cache.glob("*/projection-*/*.parquet") if _is_responses(p)]
    _halve(path, "ttft_s")
    result = ledger_cli("audit", "--db", sqlite_url, "--publish", "--json")
    assert result.exit_code == 1
    (found,) = [f for f in json.loads(result.stdout)["findings"] if f["code"] == "snapshot-mismatch"]
    assert found["target"] == f"{path.parent.name}/{path.name}" and str(path) in found["detail"]
    assert ledger_cli("report", "--db", sqlite_url, "--json").stdout == before


def test_verify_snapshot_finds_files_forged_with_their_digests(ledger: Ledger, ledger_url: str) -> None:
    """Every read re-hashes each file against state.json; a forger who rewrites both is beyond that
    check, and `ledger verify --snapshot` (rows verified again, projections derived again) names it."""
    src = open_source(ledger)  # the default cache, as the CLI finds it
    clean, folder = to_json(derive_report(src)), src.analytics.snapshot.directory
    src.close()
    result = ledger_cli("verify", "--db", ledger_url, "--snapshot", "--json")
    proof = json.loads(result.stdout)["snapshot"]
    assert result.exit_code == 0 and proof["ok"] and proof["mismatches"] == []
    assert proof["files"] > 2 and proof["head_seq"] == ledger.head().seq  # type: ignore[union-attr]
    raw, projection = _forge_with_digests(folder)
    result = ledger_cli("verify", "--db", ledger_url, "--snapshot", "--json")
    assert result.exit_code == 1
    out = json.loads(result.stdout)
    assert out["ok"] is True  # the ledger itself is whole
    found = {m["file"]: m["problem"] for m in out["snapshot"]["mismatches"]}
    assert set(found) == {str(raw)} and "digest" in found[str(raw)]
    # A whole snapshot again, then only the projection forged with its digest: derived again, it differs.
    shutil.rmtree(folder)
    src = open_source(ledger)
    assert to_json(derive_report(src)) == clean
    src.close()
    _halve(projection, "ttft_s")
    state = _state(folder)
    state["projections"][projection.parent.name.removeprefix("projection-")]["files"][raw.name]["sha256"] = (
        file_sha256(projection)
    )
    _write_state(folder, state)
    text = ledger_cli("verify", "--db", ledger_url, "--snapshot")
    assert text.exit_code == 1 and "snapshot mismatch" in text.stdout and projection.name in text.stdout
    assert "rows differ from its segment derived again" in text.stdout


@pytest.mark.slow
def test_a_sim_run_attested_over_a_tampered_cache(tmp_path: Path) -> None:
    """A real `sim` run: `ledger attest` over a cache whose TTFT projection was halved writes the
    ledger's own report files, with snapshot-mismatch in its audit (not publishable); the
    statement made over the clean cache fails `--verify` against the tampered one."""
    from tests.reports.test_sim_pipeline import FAST, SMALL, VALIDATION

    url = f"sqlite:///{tmp_path / 'sim.db'}"
    for experiment, params in (("validation", VALIDATION), ("screening", SMALL)):
        result = ledger_cli("run", experiment, "--db", url, "--target", "sim", *FAST, *params)
        assert result.exit_code == 0, result.output
    src = open_source(url)
    run_id = src.tuples("SELECT run_id FROM kv_runs ORDER BY seq DESC LIMIT 1")[0][0]
    src.close()
    src.ledger.close()
    clean, tampered = tmp_path / "clean", tmp_path / "tampered"
    made = ledger_cli("attest", "--db", url, "--run", run_id, "--out", str(clean / "s.json"))
    assert made.exit_code == 0 and ledger_cli("audit", "--db", url, "--publish").exit_code == 0
    cache = tmp_path / "cache" / "snapshots"
    responses = [p for p in cache.glob("*/projection-*/*.parquet") if _is_responses(p)]
    assert responses
    for path in responses:
        _halve(path, "ttft_s")
    assert ledger_cli("attest", "--db", url, "--verify", str(clean / "s.json")).exit_code == 1
    for path in responses:
        _halve(path, "ttft_s")
    made = ledger_cli("attest", "--db", url, "--run", run_id, "--out", str(tampered / "s.json"))
    assert made.exit_code == 0
    predicate = json.loads((tampered / "s.json").read_text())["predicate"]
    assert predicate["audit"]["publishable"] is False
    assert predicate["audit"]["findings"]["snapshot-mismatch (blocking)"] == len(responses)
    for name in ("report.json", "report.md"):
        assert (tampered / name).read_bytes() == (clean / name).read_bytes()


def test_state_naming_a_file_outside_the_snapshot_is_a_mismatch_and_touches_nothing(
    ledger: Ledger, tmp_path: Path
) -> None:
    root = tmp_path / "snapshots"
    clean, _, folder = _derive(ledger, root)
    outside = root / "keep.parquet"
    outside.write_bytes(b"not a segment")
    state = _state(folder)
    state["segments"].insert(0, {"name": "../keep.parquet", "sha256": file_sha256(outside)})
    _write_state(folder, state)
    report, findings, _ = _derive(ledger, root)
    assert report == clean and [f["target"] for f in _mismatches(findings)] == ["../keep.parquet"]
    assert outside.read_bytes() == b"not a segment"


def _forge_with_digests(folder: Path) -> tuple[Path, Path]:
    """Halve ``ttft_s`` in the first raw segment and in its response projection, and record the
    forged files' digests in state.json: the forgery that no digest kept in the cache can show."""
    state = _state(folder)
    raw = folder / state["segments"][0]["name"]
    (projection,) = [
        p for p in folder.glob("projection-*/*.parquet") if p.name == raw.name and _is_responses(p)
    ]
    _halve_ttft_in_raw(raw)
    _halve(projection, "ttft_s")
    state["segments"][0]["sha256"] = file_sha256(raw)
    state["projections"][projection.parent.name.removeprefix("projection-")]["files"][raw.name].update(
        sha256=file_sha256(projection), **{"from": state["segments"][0]["sha256"]}
    )
    _write_state(folder, state)
    return raw, projection


def test_a_cache_forged_with_its_digests_never_reaches_a_published_number(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A raw segment and its TTFT projection halved, their digests rewritten in state.json: a plain
    read serves the forgery (the cache is trusted as far as its folder is), but `ledger audit
    --publish` and `ledger attest` derive their tables from the database's rows, so what they
    publish is the ledger's report, byte for byte."""
    events, _ = generate()
    led = open_ledger(sqlite_url)
    half = len(events) // 2
    led.append_sealed(read_jsonl(iter(orjson.dumps(e) for e in events[:half])))
    src = open_source(led)  # the default cache, as the CLI finds it: a first segment
    folder = src.analytics.snapshot.directory
    src.close()
    led.append_sealed(read_jsonl(iter(orjson.dumps(e) for e in events[half:])))
    run_id = open_source(led).tuples("SELECT run_id FROM kv_runs WHERE experiment = 'screening' LIMIT 1")[0][
        0
    ]
    clean_plain = ledger_cli("report", "--db", sqlite_url, "--json").stdout
    clean = tmp_path / "clean"
    made = ledger_cli("attest", "--db", sqlite_url, "--run", run_id, "--out", str(clean / "s.json"))
    assert made.exit_code == 0, made.output
    _forge_with_digests(folder)
    # The plain read is fooled: its TTFT figures are the forger's.
    assert ledger_cli("report", "--db", sqlite_url, "--json").stdout != clean_plain
    # The publish gate is not: the same report as the clean ledger's, and nothing blocks it,
    # since the cache's proof passes and no number came from the cache.
    published = ledger_cli("audit", "--db", sqlite_url, "--publish", "--json")
    assert published.exit_code == 0, published.stdout
    assert not _mismatches(json.loads(published.stdout)["findings"])
    src = open_source(led, verify=True)
    try:
        assert json.loads(to_json(derive_report(src))) == json.loads(clean_plain)
        assert src.analytics.derived is not None and src.analytics.derived.rows == led.head().seq  # type: ignore[union-attr]
    finally:
        src.close()
    forged = tmp_path / "forged"
    made = ledger_cli("attest", "--db", sqlite_url, "--run", run_id, "--out", str(forged / "s.json"))
    assert made.exit_code == 0, made.output
    for name in ("report.json", "report.md"):
        assert (forged / name).read_bytes() == (clean / name).read_bytes()
    assert ledger_cli("attest", "--db", sqlite_url, "--verify", str(clean / "s.json")).exit_code == 0
    led.close()

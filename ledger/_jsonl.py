"""JSON Lines import and export of envelopes.

Export writes whole envelopes. Import takes whole or bare envelopes, validates
every line first (kind, required fields and types, a given digest), and then
appends them in one transaction: all lines land, or none.
"""

from __future__ import annotations

import gzip
import io
import lzma
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from ._errors import EventError, ImportFileError
from ._events import NewEvent, Sealed, seal
from ._store import Ledger

Progress = Callable[[int], None]
_ENVELOPE = ("id", "ts", "kind", "run_id", "block_id", "data")
_ALLOWED = frozenset((*_ENVELOPE, "seq", "digest", "chain"))


def _line_bytes(row: tuple[Any, ...]) -> bytes:
    seq, id_, ts, kind, run_id, block_id, data, digest, chain = row
    dump = orjson.dumps
    data_bytes = data.encode() if isinstance(data, str) else bytes(data)
    # Keys in sorted order, data spliced in as stored: the line is canonical JSON.
    return b"".join(
        (
            b'{"block_id":',
            dump(block_id),
            b',"chain":',
            dump(chain),
            b',"data":',
            data_bytes,
            b',"digest":',
            dump(digest),
            b',"id":',
            dump(id_),
            b',"kind":',
            dump(kind),
            b',"run_id":',
            dump(run_id),
            b',"seq":',
            dump(int(seq)),
            b',"ts":',
            dump(ts),
            b"}\n",
        )
    )


def export_jsonl(ledger: Ledger, out: IO[bytes], progress: Progress | None = None) -> int:
    """Write every envelope as one line; returns the number written."""
    count = 0
    for row in ledger.raw_rows():
        out.write(_line_bytes(row))
        count += 1
        if progress is not None and count % 10000 == 0:
            progress(10000)
    if progress is not None:
        progress(count % 10000)
    return count


def _parse_line(number: int, line: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ImportFileError(number, None, f"not valid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise ImportFileError(number, None, "must be a JSON object (one envelope per line)")
    for name in _ENVELOPE:
        if name not in obj:
            raise ImportFileError(number, name, "required envelope field is missing")
    unknown = set(obj) - _ALLOWED
    if unknown:
        raise ImportFileError(number, sorted(unknown)[0], "not an envelope field")
    return obj


def _seal_line(number: int, obj: dict[str, Any]) -> Sealed:
    if not isinstance(obj["kind"], str):
        raise ImportFileError(number, "kind", "must be a string")
    try:
        sealed = seal(
            NewEvent(
                kind=obj["kind"],
                data=obj["data"],
                run_id=obj["run_id"],
                block_id=obj["block_id"],
                id=obj["id"],
                ts=obj["ts"],
            )
        )
    except EventError as exc:
        raise ImportFileError(number, exc.field, exc.reason) from exc
    given = obj.get("digest")
    if given is not None and given != sealed.digest:
        raise ImportFileError(number, "digest", f"given {given} but the envelope hashes to {sealed.digest}")
    return sealed


def read_jsonl(lines: Iterator[bytes], progress: Progress | None = None) -> list[Sealed]:
    """Parse and validate every line; raises :class:`ImportFileError` on the first bad one."""
    sealed: list[Sealed] = []
    for number, line in enumerate(lines, start=1):
        if progress is not None:
            progress(1)
        if not line.strip():
            continue
        sealed.append(_seal_line(number, _parse_line(number, line)))
    return sealed


def open_jsonl(path: str | Path) -> io.BufferedIOBase:
    """The file's bytes, decompressed where its name ends in ``.xz`` or ``.gz`` (exports are
    committed and carried compressed)."""
    name = str(path)
    if name.endswith(".xz"):
        return lzma.open(path, "rb")
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def import_jsonl(ledger: Ledger, path: str | Path, progress: Progress | None = None) -> int:
    """Import a JSON Lines file (plain, ``.xz`` or ``.gz``) atomically; returns the number of
    lines appended or known."""
    try:
        with open_jsonl(path) as handle:
            sealed = read_jsonl(iter(handle), progress)
    except (lzma.LZMAError, gzip.BadGzipFile, EOFError) as exc:
        raise ImportFileError(0, None, f"{path} is not a readable compressed file: {exc}") from exc
    return len(ledger.append_sealed(sealed))

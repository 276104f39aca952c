"""Checkpoint audit: per-file bytes and SHA-256, compared with a reference.

The reference is a manifest (``{file: sha256}``, e.g. written by ``ledger
checkpoint manifest`` on a trusted copy) or a Hugging Face hub cache snapshot,
whose blobs are named by the digests the hub published: SHA-256 for LFS
files, the git blob SHA-1 for the others. With neither the checkpoint is
recorded unverified, which the report's audit blocks on.

Files are hashed from a read-only memory map (no copy out of the page cache;
hashlib releases the GIL on large buffers), several files at once on a thread
pool. A file is *stable* when its size, mtime and inode are the same before
and after it was read.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

_CHUNK = 64 << 20  # hash in 64 MiB slices so huge files don't pin one giant view


@dataclass(frozen=True)
class FileAudit:
    """One file's audit against its reference, where there is one.

    ``expected_sha256`` comes from a manifest or an LFS blob's name;
    ``expected_git_sha1`` from a non-LFS blob's name in a Hugging Face cache,
    the git blob SHA-1 (SHA-1 of ``b"blob <size>\\0"`` + content), which is
    then computed as ``git_sha1``. Both expectations None: no reference.
    """

    name: str
    bytes: int
    sha256: str
    expected_sha256: str | None
    stable: bool
    git_sha1: str | None = None
    expected_git_sha1: str | None = None

    @property
    def referenced(self) -> bool:
        return self.expected_sha256 is not None or self.expected_git_sha1 is not None

    @property
    def agrees(self) -> bool:
        """The file equals its reference (False when it has none)."""
        if self.expected_sha256 is not None:
            return self.sha256 == self.expected_sha256
        return self.expected_git_sha1 is not None and self.git_sha1 == self.expected_git_sha1


def _identity(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino


def _digests(path: Path, git_blob: bool) -> tuple[str, str | None]:
    """SHA-256 of a file's bytes and, if asked, its git blob SHA-1, in one pass over a memory map."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        blob = hashlib.sha1(b"blob %d\0" % size) if git_blob else None
        if size == 0:
            return digest.hexdigest(), blob.hexdigest() if blob else None
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        with mmap.mmap(handle.fileno(), 0, flags=flags, prot=mmap.PROT_READ) as mapped:
            if hasattr(mapped, "madvise"):
                mapped.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mapped)
            try:
                for start in range(0, size, _CHUNK):
                    with view[start : start + _CHUNK] as piece:
                        digest.update(piece)
                        if blob is not None:
                            blob.update(piece)
            finally:
                view.release()
    return digest.hexdigest(), blob.hexdigest() if blob else None


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes, streamed from a memory map."""
    return _digests(path, False)[0]


def git_blob_sha1(path: Path) -> str:
    """The git blob SHA-1 of a file (what ``git hash-object`` prints)."""
    sha1 = _digests(path, True)[1]
    assert sha1 is not None
    return sha1


SHA256, GIT_SHA1 = "sha256", "git-sha1"
Reference = tuple[str, str]
"""(kind, hex digest): kind is :data:`SHA256` or :data:`GIT_SHA1`."""


def _audit_file(root: Path, path: Path, expected: dict[str, Reference]) -> FileAudit:
    name = path.relative_to(root).as_posix()
    kind, want = expected.get(name, ("", ""))
    before = _identity(path)
    sha, sha1 = _digests(path, kind == GIT_SHA1)
    after = _identity(path)
    return FileAudit(
        name,
        after[0],
        sha,
        want if kind == SHA256 else None,
        before == after,
        sha1,
        want if kind == GIT_SHA1 else None,
    )


def checkpoint_files(root: Path) -> list[Path]:
    """Regular files under ``root`` (links resolved), hidden entries skipped, sorted."""
    files = [
        p
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    ]
    return sorted(files)


def hash_files(
    root: Path, files: Iterable[Path], expected: dict[str, Reference], workers: int | None = None
) -> list[FileAudit]:
    """Audit ``files`` in parallel; results in the order given."""
    items = list(files)
    count = workers or min(len(items), os.cpu_count() or 1) or 1
    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(lambda p: _audit_file(root, p, expected), items))


_HEX = frozenset("0123456789abcdef")


def _hex(text: str, length: int) -> bool:
    return len(text) == length and set(text) <= _HEX


def _manifest_name(name: str) -> str:
    name = name.strip().lstrip("*")  # sha256sum marks binary mode with '*'
    return name[2:] if name.startswith("./") else name


def manifest_hashes(manifest: Path) -> dict[str, str]:
    """Expected SHA-256 per file from a manifest.

    Formats: JSON ``{name: sha256}`` (what ``ledger checkpoint manifest``
    writes), JSON ``{"files": [{"name", "sha256"}, ...]}``, or ``sha256sum``
    output (``./`` prefixes are dropped). Raises ValueError naming the bad entry.
    """
    text = manifest.read_text()
    out: dict[str, str] = {}
    if text.lstrip().startswith("{"):
        data = json.loads(text)
        files = data.get("files", data)
        pairs = (
            [(f.get("name"), f.get("sha256")) for f in files]
            if isinstance(files, list)
            else list(files.items())
        )
        for name, sha in pairs:
            if not isinstance(name, str) or not isinstance(sha, str) or not _hex(sha.lower(), 64):
                raise ValueError(f"{manifest}: entry {name!r} has no SHA-256 (64 hex digits): {sha!r}")
            out[_manifest_name(name)] = sha.lower()
        return out
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if len(parts) != 2 or not _hex(parts[0].lower(), 64):
            raise ValueError(f"{manifest}: line {number} is not 'SHA256  NAME': {line[:80]!r}")
        out[_manifest_name(parts[1])] = parts[0].lower()
    return out


def hf_snapshot_hashes(snapshot: Path) -> dict[str, Reference]:
    """Expected digests from a Hugging Face hub cache snapshot.

    ``snapshots/<revision>/<file>`` links to ``../../blobs/<name>``, and the
    hub client names each blob by the digest the hub published for it (its
    ETag): an LFS file's SHA-256 (64 hex digits), or a regular git file's blob
    SHA-1 (40). Every link is a reference, a dangling one too (its blob is
    then reported missing); a plain file in a snapshot has none.
    """
    out: dict[str, Reference] = {}
    for path in sorted(snapshot.rglob("*")):
        rel = path.relative_to(snapshot)
        if not path.is_symlink() or any(part.startswith(".") for part in rel.parts):
            continue
        blob = Path(os.readlink(path)).name
        if _hex(blob, 64):
            out[rel.as_posix()] = (SHA256, blob)
        elif _hex(blob, 40):
            out[rel.as_posix()] = (GIT_SHA1, blob)
    return out


def _hf_snapshot(root: Path) -> tuple[Path, str] | None:
    """(snapshot directory, revision) when ``root`` is in a hub cache's ``snapshots/<revision>``."""
    parts = Path(os.path.abspath(root)).parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots" and Path(*parts[:i], "blobs").is_dir():
            return Path(*parts[: i + 2]), parts[i + 1]
    return None


MANIFEST_HELP = (
    "supply a manifest: on a trusted copy of the checkpoint run "
    "`ledger checkpoint manifest DIR > MANIFEST.json` (JSON {file: sha256}; `sha256sum` output "
    "also works), then `ledger checkpoint audit DIR --manifest MANIFEST.json` "
    "(the vllm target: --param manifest=MANIFEST.json), or audit a Hugging Face cache snapshot "
    "(hub/models--ORG--NAME/snapshots/REV)"
)
"""How to give a checkpoint something to be checked against (said wherever one is missing)."""


@dataclass(frozen=True)
class CheckpointAudit:
    """The ``checkpoint.audited`` event's data.

    ``matched``: True when every file agrees with its reference and no
    referenced file is missing; None when there is no reference at all
    (unverified); else False.
    """

    path: str
    revision: str | None
    files: list[FileAudit]
    matched: bool | None
    stable: bool
    reference: str | None
    missing: list[str]

    def data(self) -> dict[str, object]:
        return {
            "path": self.path,
            "revision": self.revision,
            "matched": self.matched,
            "stable": self.stable,
            "reference": self.reference,
            "total_bytes": sum(f.bytes for f in self.files),
            "files": [asdict(f) for f in self.files],
            "missing": self.missing,
        }

    @property
    def problems(self) -> list[str]:
        """What keeps the checkpoint from being verified, one phrase each (empty: verified)."""
        if self.reference is None or self.matched is None:
            return ["no reference to check against; " + MANIFEST_HELP]
        out = [
            f"{f.name}: {'SHA-256' if f.expected_sha256 else 'git blob SHA-1'} differs"
            for f in self.files
            if f.referenced and not f.agrees
        ]
        out += [f"{f.name}: not in the reference" for f in self.files if not f.referenced]
        out += [f"{name}: missing" for name in self.missing]
        if not self.stable:
            out.append("files changed while being read")
        return out


def _match(files: list[FileAudit], missing: list[str]) -> bool | None:
    if not any(f.referenced for f in files) and not missing:
        return None
    # Every file must have a reference and agree with it; a missing reference is no match.
    return not missing and all(f.referenced and f.agrees for f in files)


def audit_checkpoint(
    directory: str | Path,
    revision: str | None = None,
    manifest: str | Path | None = None,
    workers: int | None = None,
) -> CheckpointAudit:
    """Hash every file of a checkpoint and compare with the manifest or HF snapshot.

    Without either the audit is recorded unverified (``matched`` None, ``reference`` None).
    """
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"checkpoint directory not found: {root}")
    expected: dict[str, Reference] = {}
    reference = None
    if manifest is not None:
        expected = {n: (SHA256, h) for n, h in manifest_hashes(Path(manifest)).items()}
        reference = f"manifest:{manifest}"
    elif (snapshot := _hf_snapshot(root)) is not None:
        # Links are relative to the directory audited, which may be a folder inside the snapshot.
        expected, reference = hf_snapshot_hashes(root), "hf-cache-snapshot"
        revision = revision or snapshot[1]
    paths = checkpoint_files(root)
    files = hash_files(root, paths, expected, workers)
    present = {f.name for f in files}
    missing = sorted(n for n in expected if n not in present)
    return CheckpointAudit(
        str(root.resolve()),
        revision,
        files,
        _match(files, missing),
        all(f.stable for f in files),
        reference,
        missing,
    )


def manifest_for(directory: str | Path, workers: int | None = None) -> dict[str, str]:
    """``{file: sha256}`` of every file under ``directory`` (``ledger checkpoint manifest``)."""
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"checkpoint directory not found: {root}")
    return {f.name: f.sha256 for f in hash_files(root, checkpoint_files(root), {}, workers)}

"""Checkpoint audit: per-file bytes and SHA-256, compared with a published revision.

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
    """One file's audit: ``expected_sha256`` is None when no reference was found."""

    name: str
    bytes: int
    sha256: str
    expected_sha256: str | None
    stable: bool


def _identity(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ino


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes, streamed from a memory map."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return digest.hexdigest()
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        with mmap.mmap(handle.fileno(), 0, flags=flags, prot=mmap.PROT_READ) as mapped:
            if hasattr(mapped, "madvise"):
                mapped.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mapped)
            try:
                for start in range(0, size, _CHUNK):
                    digest.update(view[start : start + _CHUNK])
            finally:
                view.release()
    return digest.hexdigest()


def _audit_file(root: Path, path: Path, expected: dict[str, str]) -> FileAudit:
    before = _identity(path)
    sha = sha256_file(path)
    after = _identity(path)
    name = path.relative_to(root).as_posix()
    return FileAudit(name, after[0], sha, expected.get(name), before == after)


def checkpoint_files(root: Path) -> list[Path]:
    """Regular files under ``root`` (links resolved), hidden entries skipped, sorted."""
    files = [p for p in root.rglob("*") if p.is_file() and not any(
        part.startswith(".") for part in p.relative_to(root).parts)]
    return sorted(files)


def hash_files(root: Path, files: Iterable[Path], expected: dict[str, str],
               workers: int | None = None) -> list[FileAudit]:
    """Audit ``files`` in parallel; results in the order given."""
    items = list(files)
    count = workers or min(len(items), os.cpu_count() or 1) or 1
    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(lambda p: _audit_file(root, p, expected), items))


def manifest_hashes(manifest: Path) -> dict[str, str]:
    """Expected hashes from a manifest: JSON ``{name: sha256}`` or ``sha256sum`` text."""
    text = manifest.read_text()
    if text.lstrip().startswith("{"):
        data = json.loads(text)
        files = data.get("files", data)
        if isinstance(files, list):
            return {f["name"]: f["sha256"] for f in files}
        return {str(k): str(v) for k, v in files.items()}
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip():
            sha, name = line.split(maxsplit=1)
            out[name.lstrip("*").strip()] = sha
    return out


def hf_snapshot_hashes(snapshot: Path) -> dict[str, str]:
    """Expected hashes from a Hugging Face cache snapshot.

    ``snapshots/<revision>/<file>`` links to ``blobs/<name>``; LFS blobs are
    named by their SHA-256, so the link target *is* the published digest.
    Small non-LFS files are named by a git blob SHA-1 and give no expectation.
    """
    out: dict[str, str] = {}
    for path in checkpoint_files(snapshot):
        link = path
        if not link.is_symlink():
            continue
        blob = Path(os.readlink(link)).name
        if len(blob) == 64 and all(c in "0123456789abcdef" for c in blob):
            out[path.relative_to(snapshot).as_posix()] = blob
    return out


@dataclass(frozen=True)
class CheckpointAudit:
    """The ``checkpoint.audited`` event's data."""

    path: str
    revision: str | None
    files: list[FileAudit]
    matched: bool | None
    stable: bool
    reference: str | None

    def data(self) -> dict[str, object]:
        return {"path": self.path, "revision": self.revision, "matched": self.matched,
                "stable": self.stable, "reference": self.reference,
                "total_bytes": sum(f.bytes for f in self.files),
                "files": [asdict(f) for f in self.files]}


def _match(files: list[FileAudit]) -> bool | None:
    checked = [f for f in files if f.expected_sha256 is not None]
    if not checked:
        return None
    # Every file must have a reference and agree with it; a missing reference is no match.
    return len(checked) == len(files) and all(f.sha256 == f.expected_sha256 for f in checked)


def audit_checkpoint(directory: str | Path, revision: str | None = None,
                     manifest: str | Path | None = None, workers: int | None = None) -> CheckpointAudit:
    """Hash every file of a checkpoint and compare with the manifest or HF snapshot."""
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"checkpoint directory not found: {root}")
    expected, reference = {}, None
    if manifest is not None:
        expected, reference = manifest_hashes(Path(manifest)), f"manifest:{manifest}"
    elif "snapshots" in root.parts:
        expected, reference = hf_snapshot_hashes(root), "hf-cache-snapshot"
        revision = revision or root.name
    files = hash_files(root, checkpoint_files(root), expected, workers)
    return CheckpointAudit(str(root.resolve()), revision, files, _match(files),
                           all(f.stable for f in files), reference)

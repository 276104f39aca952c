"""The GPU engine bundle: built where a registry is reachable, installed where none is.

    python -m experiments.targets.vllm.bundle build [--part-mib 60] [--no-ledger]
    python -m experiments.targets.vllm.bundle stage BUNDLE_DIR DEST [--max-mib 60]
    python -m experiments.targets.vllm.bundle install STASH [STASH ...] --into DIR

``build`` reads ``bundle.toml``: it downloads the pinned wheels for the GPU
host's interpreter (``--no-deps``, the host's platform tags), unpacks each
archive's wheels into a site directory, prunes what a serve never loads, and
writes ``<archive>.tar.xz.part-NNN`` files of at most ``--part-mib`` MiB, a
``BUNDLE.json`` (what is inside) and ``SHA256SUMS`` (``sha256sum -c`` format)
under ``${KVLEDGER_CACHE:-~/.cache/kvledger}/bundles/gpu-<key>/parts/``, never
in the clone. ``<key>`` is a digest of ``bundle.toml``.

``stage`` lays the parts out in folders ``c1``, ``c2``, ... of at most
``--max-mib`` MiB each, for hosts that take files in bounded transfers.

``install`` finds ``SHA256SUMS`` and every part it names anywhere under the
given directories, checks all of them before unpacking anything (a missing or
altered part is refused by name, exit 2), unpacks the archives into a
temporary directory beside ``--into`` and renames it into place only once
everything is unpacked: a failed install leaves nothing behind. Use it with
``PYTHONPATH=DIR python3 -m vllm.entrypoints.openai.api_server ...``.

Standard library only: the installer runs before anything else is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
DEFAULT_PINS = HERE / "bundle.toml"
SUMS = "SHA256SUMS"
MANIFEST = "BUNDLE.json"
MARKER = ".kvledger-bundle.json"
MIB = 1 << 20
HASH_LEN = 16

__all__ = [
    "BundleError",
    "PinError",
    "build",
    "bundle_key",
    "check_pins",
    "find_parts",
    "install",
    "load_pins",
    "main",
    "missing_ledger_dependencies",
    "normalize",
    "pip_download_argv",
    "platform_tags",
    "select_wheels",
    "split_into",
    "stage",
    "write_sums",
]


class BundleError(RuntimeError):
    """A bundle cannot be built or installed (exit status 2 from the command line)."""


class PinError(BundleError):
    """``bundle.toml`` is malformed (a loose pin, an unknown key)."""


# --------------------------------------------------------------------------- pins


def load_pins(path: Path | None = None) -> dict[str, Any]:
    with open(path or DEFAULT_PINS, "rb") as f:
        pins = tomllib.load(f)
    check_pins(pins)
    return pins


def normalize(name: str) -> str:
    """PEP 503 name: ``Typing_Extensions`` → ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


def parse_pin(spec: str) -> tuple[str, str]:
    """``name==version`` → (normalised name, version); anything looser is refused."""
    m = _PIN.match(spec.strip())
    if m is None:
        raise PinError(f"not an exact pin (name==version): {spec!r}")
    return normalize(m.group(1)), m.group(2)


def check_pins(pins: Mapping[str, Any]) -> None:
    """Every wheel exactly pinned, once across all archives; host facts present."""
    host = pins.get("host")
    if not isinstance(host, Mapping) or not {"python", "implementation", "platforms"} <= set(host):
        raise PinError("[host] needs python, implementation and platforms")
    archives = pins.get("archives")
    if not isinstance(archives, Mapping) or not archives:
        raise PinError("no [archives.*] tables")
    seen: dict[str, str] = {}
    provided = {normalize(p) for p in host.get("provides", [])}
    for name, spec in archives.items():
        if not re.fullmatch(r"[a-z][a-z0-9]*", name):
            raise PinError(f"archive name {name!r}: lower-case letters and digits only")
        for wheel in spec.get("wheels", []):
            dist, _ = parse_pin(wheel)
            if dist in seen:
                raise PinError(f"{dist} is pinned in both [archives.{seen[dist]}] and [archives.{name}]")
            if dist in provided:
                raise PinError(f"{dist} is pinned in [archives.{name}] but the host provides it")
            seen[dist] = name


def platform_tags(host: Mapping[str, Any]) -> list[str]:
    """The host's platform tags, ``manylinux_2_{5..39}_x86_64`` expanded."""
    out: list[str] = []
    for tag in host["platforms"]:
        m = re.search(r"\{(\d+)\.\.(\d+)\}", tag)
        if m is None:
            out.append(tag)
            continue
        lo, hi = int(m.group(1)), int(m.group(2))
        out += [tag[: m.start()] + str(i) + tag[m.end() :] for i in range(lo, hi + 1)]
    return out


def _target_args(host: Mapping[str, Any]) -> list[str]:
    args = [
        "--only-binary=:all:",
        "--python-version",
        str(host["python"]),
        "--implementation",
        str(host["implementation"]),
    ]
    for tag in platform_tags(host):
        args += ["--platform", tag]
    return args


def pip_download_argv(
    python: str, host: Mapping[str, Any], wheels: Sequence[str], dest: Path, index_args: Sequence[str] = ()
) -> list[str]:
    """``pip download`` of exactly ``wheels`` for the host's interpreter, no dependencies."""
    return [
        python,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--progress-bar",
        "off",
        *_target_args(host),
        *index_args,
        "-d",
        str(dest),
        *wheels,
    ]


def bundle_key(pins: Mapping[str, Any]) -> str:
    blob = json.dumps(pins, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:HASH_LEN]


def missing_ledger_dependencies(pins: Mapping[str, Any], requirements: Iterable[str]) -> list[str]:
    """kvledger's requirements that neither the host provides nor an archive brings."""
    have = {normalize(p) for p in pins["host"].get("provides", [])}
    for spec in pins["archives"].values():
        have |= {parse_pin(w)[0] for w in spec.get("wheels", [])}
    missing = []
    for req in requirements:
        m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        if m and normalize(m.group(1)) not in have:
            missing.append(normalize(m.group(1)))
    return missing


# --------------------------------------------------------------------------- wheels


def _wheel_tags(filename: str) -> tuple[str, str, set[str], set[str], set[str]]:
    """(name, version, python tags, abi tags, platform tags) of a wheel file name."""
    parts = filename[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        raise BundleError(f"not a wheel file name: {filename}")
    name, version = parts[0], parts[1]
    py, abi, plat = parts[-3], parts[-2], parts[-1]
    return normalize(name), version, set(py.split(".")), set(abi.split(".")), set(plat.split("."))


def _fits(filename: str, host: Mapping[str, Any]) -> bool:
    """Whether pip would install this wheel on the host (CPython 3.minor, its platforms)."""
    _, _, pys, abis, plats = _wheel_tags(filename)
    impl, minor = str(host["implementation"]), int(str(host["python"]).split(".")[1])

    def older(tag: str, prefix: str) -> bool:  # py37 / cp311: built for this or an older 3.x
        m = re.fullmatch(rf"{prefix}3(\d*)", tag)
        return m is not None and (m.group(1) == "" or int(m.group(1)) <= minor)

    exact = f"{impl}3{minor}"
    py_ok = (
        any(older(p, "py") for p in pys)
        or exact in pys
        or ("abi3" in abis and any(older(p, impl) for p in pys))
    )
    abi_ok = bool(abis & {"none", "abi3", exact})
    plat_ok = bool(plats & set(platform_tags(host)))
    return py_ok and abi_ok and plat_ok


def select_wheels(pins_wheels: Sequence[str], files: Iterable[str], host: Mapping[str, Any]) -> list[str]:
    """For each pin, the one wheel file of that name and version that fits the host.

    ``files`` may hold other versions or other platforms' builds (a shared
    download cache); a pin with no fitting wheel is an error naming it.
    """
    by_dist: dict[tuple[str, str], list[str]] = {}
    for f in files:
        if f.endswith(".whl"):
            name, version, *_ = _wheel_tags(f)
            by_dist.setdefault((name, version), []).append(f)
    chosen, missing = [], []
    for pin in pins_wheels:
        name, version = parse_pin(pin)
        fitting = sorted(f for f in by_dist.get((name, version), []) if _fits(f, host))
        if not fitting:
            missing.append(pin)
        else:
            chosen.append(fitting[0])
    if missing:
        raise BundleError(f"no wheel for the host's interpreter: {', '.join(missing)}")
    return chosen


# --------------------------------------------------------------------------- archives


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MIB):
            h.update(chunk)
    return h.hexdigest()


def prune(site: Path, patterns: Sequence[str]) -> list[str]:
    """Delete what ``patterns`` (globs relative to ``site``) name; the removed paths."""
    removed = []
    for pattern in patterns:
        for p in sorted(site.glob(pattern)):
            removed.append(p.relative_to(site).as_posix())
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for cache in sorted(site.rglob("__pycache__"), reverse=True):
        shutil.rmtree(cache, ignore_errors=True)
    return removed


def _tar_into(site: Path, out: IO[bytes]) -> None:
    """A tar of ``site``'s contents in name order, owners zeroed (same tree → same bytes)."""

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(site.rglob("*")):
            tar.add(path, arcname=path.relative_to(site).as_posix(), recursive=False, filter=clean)


def compress_site(site: Path, dest: Path, *, preset: int = 6) -> None:
    """``site`` → ``dest`` (.tar.xz): through ``xz -T0`` when present (all cores), else lzma."""
    xz = shutil.which("xz")
    tmp = dest.with_name(dest.name + ".tmp")
    with open(tmp, "wb") as raw:
        if xz is not None:
            proc = subprocess.Popen([xz, "-T0", f"-{preset}", "-c"], stdin=subprocess.PIPE, stdout=raw)
            assert proc.stdin is not None
            try:
                _tar_into(site, proc.stdin)
            finally:
                proc.stdin.close()
            if proc.wait() != 0:
                raise BundleError(f"xz failed with exit {proc.returncode}")
        else:
            with lzma.open(raw, "wb", preset=preset) as lz:
                _tar_into(site, lz)
    os.replace(tmp, dest)


def split_into(archive: Path, dest: Path, part_bytes: int) -> list[str]:
    """``archive`` → ``dest/<archive name>.part-000``, ... of at most ``part_bytes``; their names."""
    if part_bytes <= 0:
        raise BundleError("part size must be positive")
    names: list[str] = []
    with open(archive, "rb") as f:
        while chunk := f.read(part_bytes):
            name = f"{archive.name}.part-{len(names):03d}"
            (dest / name).write_bytes(chunk)
            names.append(name)
    return names


def write_sums(directory: Path, names: Sequence[str]) -> Path:
    """``SHA256SUMS`` of ``names`` in ``directory`` (``sha256sum -c`` reads it)."""
    lines = [f"{sha256_file(directory / n)}  {n}\n" for n in names]
    (directory / SUMS).write_text("".join(lines))
    return directory / SUMS


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not p.is_symlink())


# --------------------------------------------------------------------------- build


def cache_root() -> Path:
    env = os.environ.get("KVLEDGER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kvledger"


def _log(out: IO[str] | None, msg: str) -> None:
    if out is not None:
        print(f"[bundle] {msg}", file=out, flush=True)


def _pip(argv: Sequence[str], what: str) -> None:
    proc = subprocess.run(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-30:])
        raise BundleError(f"{what} failed (exit {proc.returncode}):\n{tail}")


def build(
    pins: Mapping[str, Any],
    *,
    root: Path | None = None,
    part_bytes: int = 60 * MIB,
    archives: Sequence[str] | None = None,
    python: str = sys.executable,
    index_args: Sequence[str] = (),
    preset: int = 6,
    out: IO[str] | None = sys.stderr,
) -> Path:
    """Build the bundle's parts; the directory holding them, ``SHA256SUMS`` and ``BUNDLE.json``.

    ``index_args`` go to ``pip download`` (e.g. ``--no-index --find-links DIR``);
    by default pip's own configuration decides where wheels come from.
    """
    root = root or cache_root() / "bundles"
    key = bundle_key(pins)
    work = root / f"gpu-{key}"
    wheels_dir = root / "wheels"  # shared by builds: a changed pin downloads only what changed
    host = pins["host"]
    names = list(archives) if archives is not None else list(pins["archives"])
    unknown = set(names) - set(pins["archives"])
    if unknown:
        raise BundleError(f"unknown archive(s): {sorted(unknown)}")
    wheels_dir.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {
        "key": key,
        "host": dict(host),
        "part_bytes": part_bytes,
        "xz_preset": preset,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "archives": {},
    }
    built = {
        name: _build_archive(
            name,
            pins["archives"][name],
            host,
            work,
            wheels_dir,
            part_bytes,
            python=python,
            index_args=index_args,
            preset=preset,
            out=out,
        )
        for name in names
    }
    parts_dir = work / "parts"
    if parts_dir.exists():
        shutil.rmtree(parts_dir)
    parts_dir.mkdir(parents=True)
    all_parts: list[str] = []
    for name, (archive, info) in built.items():
        parts = split_into(archive, parts_dir, part_bytes)
        all_parts += parts
        manifest["archives"][name] = {**info, "parts": parts}
    (parts_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    write_sums(parts_dir, [*all_parts, MANIFEST])
    return parts_dir


def _build_archive(
    name: str,
    spec: Mapping[str, Any],
    host: Mapping[str, Any],
    work: Path,
    wheels_dir: Path,
    part_bytes: int,
    *,
    python: str,
    index_args: Sequence[str],
    preset: int,
    out: IO[str] | None,
) -> tuple[Path, dict[str, Any]]:
    """One archive (.tar.xz), in a directory named by what decides it (reused when complete).

    The part size is no part of it: splitting again into other sizes is cheap.
    """
    decided_by: list[Any] = [dict(host), dict(spec)] + ([preset] if preset != 6 else [])
    digest = hashlib.sha256(json.dumps(decided_by, sort_keys=True).encode())
    where = work / "archives" / f"{name}-{digest.hexdigest()[:HASH_LEN]}"
    done = where / "info.json"
    if done.exists():
        _log(out, f"{name}: already built in {where}")
        return where / f"{name}.tar.xz", json.loads(done.read_text())
    if where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True)
    t0 = time.monotonic()
    _log(out, f"{name}: downloading {len(spec['wheels'])} wheels into {wheels_dir}")
    _pip(pip_download_argv(python, host, spec["wheels"], wheels_dir, index_args), f"{name}: pip download")
    chosen = select_wheels(spec["wheels"], os.listdir(wheels_dir), host)
    site = work / f"site-{name}"
    if site.exists():
        shutil.rmtree(site)
    _log(out, f"{name}: unpacking into {site}")
    _pip(
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-compile",
            "--no-index",
            "--progress-bar",
            "off",
            "--target",
            str(site),
            *_target_args(host),
            *(str(wheels_dir / w) for w in chosen),
        ],
        f"{name}: pip install --target",
    )
    removed = prune(site, spec.get("prune", []))
    unpacked = _dir_bytes(site)
    archive = where / f"{name}.tar.xz"
    _log(out, f"{name}: compressing {unpacked / MIB:.0f} MiB (xz)")
    compress_site(site, archive, preset=preset)
    compressed = archive.stat().st_size
    info = {
        "required": bool(spec.get("required", True)),
        "wheels": list(chosen),
        "pruned": removed,
        "unpacked_bytes": unpacked,
        "compressed_bytes": compressed,
        "sha256": sha256_file(archive),
    }
    done.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")  # written last: complete
    shutil.rmtree(site)
    seconds = time.monotonic() - t0
    _log(out, f"{name}: {compressed / MIB:.1f} MiB, {seconds:.0f} s")
    return archive, info


def stage(parts_dir: Path, dest: Path, *, max_bytes: int = 60 * MIB) -> list[Path]:
    """Copy a bundle's files into ``dest/c1``, ``c2``, ... of at most ``max_bytes`` each.

    Parts go in order; ``BUNDLE.json`` and ``SHA256SUMS`` ride in the last folder
    that has room (they are small). The folders, in order.
    """
    names = [
        line.split(None, 1)[1].strip() for line in (parts_dir / SUMS).read_text().splitlines() if line.strip()
    ]
    files = [n for n in names if n != MANIFEST] + [MANIFEST, SUMS]
    folders: list[list[str]] = [[]]
    used = [0]
    for name in files:
        size = (parts_dir / name).stat().st_size
        if size > max_bytes:
            raise BundleError(f"{name} is {size} bytes, more than one folder holds ({max_bytes})")
        if used[-1] + size > max_bytes:
            folders.append([])
            used.append(0)
        folders[-1].append(name)
        used[-1] += size
    out = []
    for i, group in enumerate(folders, start=1):
        d = dest / f"c{i}"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        for name in group:
            shutil.copy2(parts_dir / name, d / name)
        out.append(d)
    return out


# --------------------------------------------------------------------------- install


@dataclass(frozen=True)
class Found:
    sums: Path
    expected: dict[str, str]  # name -> sha256
    paths: dict[str, Path]  # name -> where it lies


def _walk(dirs: Sequence[Path]) -> Iterator[Path]:
    for d in dirs:
        if d.is_file():
            yield d
        elif d.is_dir():
            yield from (p for p in sorted(d.rglob("*")) if p.is_file())
        else:
            raise BundleError(f"no such directory: {d}")


def find_parts(dirs: Sequence[Path]) -> Found:
    """Locate ``SHA256SUMS`` and each file it names anywhere under ``dirs`` (by file name)."""
    by_name: dict[str, list[Path]] = {}
    for p in _walk(dirs):
        by_name.setdefault(p.name, []).append(p)
    sums = by_name.get(SUMS, [])
    if len(sums) != 1:
        where = ", ".join(str(d) for d in dirs)
        raise BundleError(f"{'no' if not sums else 'more than one'} {SUMS} under {where}")
    expected: dict[str, str] = {}
    for n, line in enumerate(sums[0].read_text().splitlines(), start=1):
        if not line.strip():
            continue
        digest, _, name = line.partition("  ")
        if not re.fullmatch(r"[0-9a-f]{64}", digest) or not name or "/" in name:
            raise BundleError(f"{sums[0]} line {n} is not '<sha256>  <name>': {line!r}")
        expected[name.strip()] = digest
    paths: dict[str, Path] = {}
    missing, doubled = [], []
    for name in expected:
        found = by_name.get(name, [])
        if not found:
            missing.append(name)
        elif len(found) > 1:
            doubled.append(f"{name} ({', '.join(str(p) for p in found)})")
        else:
            paths[name] = found[0]
    if missing:
        raise BundleError(f"missing part(s): {', '.join(missing)}")
    if doubled:
        raise BundleError(f"part(s) found more than once: {'; '.join(doubled)}")
    return Found(sums[0], expected, paths)


def verify(found: Found, out: IO[str] | None = None) -> None:
    """Every listed file's SHA-256 equals ``SHA256SUMS``'; altered ones named (all of them)."""
    altered = []
    for name, digest in found.expected.items():
        got = sha256_file(found.paths[name])
        if got != digest:
            altered.append(f"{name} (sha256 {got[:12]}…, expected {digest[:12]}…)")
    if altered:
        raise BundleError(f"altered part(s): {', '.join(altered)}")
    _log(out, f"{len(found.expected)} file(s) match {found.sums}")


class _Concat(io.RawIOBase):
    """The parts of one archive read as one stream."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._paths = list(paths)
        self._f: IO[bytes] | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while True:
            if self._f is None:
                if not self._paths:
                    return 0
                self._f = open(self._paths.pop(0), "rb")  # noqa: SIM115
            n = self._f.readinto(view)  # type: ignore[attr-defined]
            if n:
                return int(n)
            self._f.close()
            self._f = None

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        super().close()


def _unpack(parts: Sequence[Path], dest: Path) -> None:
    with (
        lzma.LZMAFile(io.BufferedReader(_Concat(parts), MIB)) as lz,
        tarfile.open(fileobj=lz, mode="r|") as tar,
    ):
        tar.extractall(dest, filter="data")


def install(
    dirs: Sequence[Path],
    into: Path,
    *,
    only: Sequence[str] | None = None,
    force: bool = False,
    out: IO[str] | None = sys.stderr,
) -> dict[str, Any]:
    """Check every part, then unpack the archives into ``into`` (all or nothing).

    ``only`` names the archives to install (default: all the bundle has); a
    required archive cannot be left out. An ``into`` that already holds this
    bundle is left alone; one holding something else is refused unless
    ``force``.
    """
    found = find_parts(dirs)
    if MANIFEST not in found.expected:
        raise BundleError(f"{found.sums} does not list {MANIFEST}")
    verify(found, out)
    manifest = json.loads(found.paths[MANIFEST].read_text())
    archives: dict[str, Any] = manifest["archives"]
    wanted = list(only) if only else list(archives)
    unknown = [a for a in wanted if a not in archives]
    if unknown:
        raise BundleError(f"the bundle has no archive(s) {unknown} (it has {sorted(archives)})")
    left_out = [a for a, spec in archives.items() if spec.get("required") and a not in wanted]
    if left_out:
        raise BundleError(f"archive(s) {left_out} are required")
    record = {"key": manifest["key"], "archives": sorted(wanted), "host": manifest.get("host")}
    marker = into / MARKER
    if into.exists():
        try:
            current = json.loads(marker.read_text())
        except (OSError, ValueError):
            current = None
        if current == record:
            _log(out, f"{into} already holds this bundle")
            return {**record, "into": str(into), "installed": False}
        if not force:
            held = "something else" if current is None else "another bundle"
            raise BundleError(f"{into} exists and holds {held}; choose another --into or pass --force")
    tmp = into.with_name(f".{into.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    t0 = time.monotonic()
    try:
        for name in wanted:
            _log(out, f"unpacking {name} ({len(archives[name]['parts'])} part(s))")
            _unpack([found.paths[p] for p in archives[name]["parts"]], tmp)
        (tmp / MARKER).write_text(json.dumps(record, sort_keys=True) + "\n")
        if into.exists():
            shutil.rmtree(into)
        os.replace(tmp, into)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    seconds = time.monotonic() - t0
    _log(out, f"installed into {into} in {seconds:.0f} s: PYTHONPATH={into}")
    return {**record, "into": str(into), "installed": True, "seconds": round(seconds, 1)}


# --------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.targets.vllm.bundle", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download, unpack, prune, compress and split (needs a registry)")
    b.add_argument("--pins", type=Path, default=DEFAULT_PINS)
    b.add_argument("--part-mib", type=int, default=60, help="largest part, MiB (default 60)")
    b.add_argument("--no-ledger", action="store_true", help="leave out kvledger's own dependencies")
    b.add_argument(
        "--preset",
        type=int,
        default=6,
        choices=range(10),
        metavar="0-9",
        help="xz preset (default 6; 9 is smaller and slower)",
    )
    b.add_argument(
        "--root", type=Path, default=None, help="default ${KVLEDGER_CACHE:-~/.cache/kvledger}/bundles"
    )
    s = sub.add_parser("stage", help="copy the parts into folders c1, c2, ... of bounded size")
    s.add_argument("parts", type=Path)
    s.add_argument("dest", type=Path)
    s.add_argument("--max-mib", type=int, default=60)
    i = sub.add_parser("install", help="check the parts' sums, then unpack (all or nothing)")
    i.add_argument("stash", type=Path, nargs="+", help="directories holding the parts (searched recursively)")
    i.add_argument("--into", type=Path, required=True, help="the site directory to create (PYTHONPATH)")
    i.add_argument("--only", action="append", metavar="ARCHIVE", help="engine, ledger (default: all)")
    i.add_argument("--force", action="store_true", help="replace an --into that holds something else")
    i.add_argument("--json", action="store_true", help="print what was installed as JSON")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            pins = load_pins(args.pins)
            names = [a for a in pins["archives"] if not (args.no_ledger and a == "ledger")]
            parts = build(
                pins, root=args.root, part_bytes=args.part_mib * MIB, archives=names, preset=args.preset
            )
            for line in (parts / SUMS).read_text().splitlines():
                digest, name = line.split("  ", 1)
                print(f"{(parts / name).stat().st_size:>12}  {digest}  {parts / name}")
        elif args.cmd == "stage":
            for d in stage(args.parts, args.dest, max_bytes=args.max_mib * MIB):
                print(f"{_dir_bytes(d):>12}  {d}  ({', '.join(sorted(p.name for p in d.iterdir()))})")
        else:
            result = install(args.stash, args.into, only=args.only, force=args.force)
            if args.json:
                print(json.dumps(result, sort_keys=True))
    except (BundleError, OSError, tarfile.TarError, lzma.LZMAError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

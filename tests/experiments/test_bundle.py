"""The GPU engine bundle: pins, wheel selection, and build → stage → install on small wheels.

The real bundle (vLLM + LMCache, ~160 MiB of parts) is built on a machine with
registry access; here the same code builds one from two tiny wheels made on
the spot (real pip, no network), and the installer is shown to refuse a
missing or altered part by name and to leave nothing behind when it does.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

from experiments.targets.vllm import bundle as b
from experiments.targets.vllm.bundle import BundleError, PinError

REPO = Path(__file__).resolve().parents[2]
HOST = {
    "python": "3.12",
    "implementation": "cp",
    "platforms": ["manylinux_2_{17..28}_x86_64", "manylinux2014_x86_64", "any"],
}


# --------------------------------------------------------------------------- pins


def test_committed_pins_are_exact_and_cover_kvledger() -> None:
    pins = b.load_pins()
    engine = dict(b.parse_pin(w) for w in pins["archives"]["engine"]["wheels"])
    assert engine["vllm"] == "0.26.0" and engine["lmcache"] == "0.5.3"
    assert pins["host"]["torch"].startswith("2.11.0") and pins["host"]["python"] == "3.12"
    # Every runtime dependency of kvledger is on the host or in an archive: `ledger run` works there.
    with open(REPO / "pyproject.toml", "rb") as f:
        requirements = tomllib.load(f)["project"]["dependencies"]
    assert b.missing_ledger_dependencies(pins, requirements) == []
    assert b.missing_ledger_dependencies(pins, [*requirements, "polars>=1"]) == ["polars"]


@pytest.mark.parametrize(
    ("wheels", "message"),
    [
        (["vllm>=0.26"], "not an exact pin"),
        (["vllm==0.26.0", "VLLM==0.26.0"], "pinned in both"),
        (["torch==2.11.0"], "host provides it"),
    ],
)
def test_loose_or_doubled_pins_refused(wheels: list[str], message: str) -> None:
    pins = {"host": {**HOST, "provides": ["torch"]}, "archives": {"engine": {"wheels": wheels}}}
    with pytest.raises(PinError, match=message):
        b.check_pins(pins)


def test_platform_tags_and_download_argv() -> None:
    tags = b.platform_tags(HOST)
    assert tags[0] == "manylinux_2_17_x86_64" and tags[11] == "manylinux_2_28_x86_64" and len(tags) == 14
    argv = b.pip_download_argv("py", HOST, ["a==1"], Path("/w"))
    assert argv[:5] == ["py", "-m", "pip", "download", "--no-deps"]
    assert argv[argv.index("--python-version") + 1] == "3.12" and argv.count("--platform") == 14
    assert argv[-3:] == ["-d", "/w", "a==1"]


def test_select_wheels_picks_the_hosts_build() -> None:
    files = [
        "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl",
        "pyzmq-27.1.0-cp311-cp311-manylinux_2_28_x86_64.whl",  # another Python
        "pyzmq-27.1.0-cp312-cp312-manylinux_2_28_aarch64.whl",  # another machine
        "pyzmq-27.1.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        "interegular-0.3.3-py37-none-any.whl",
        "newer-1.0-cp313-cp313-manylinux_2_28_x86_64.whl",
    ]
    chosen = b.select_wheels(["vllm==0.26.0", "pyzmq==27.1.0", "interegular==0.3.3"], files, HOST)
    assert chosen == [files[0], files[4], files[5]]
    with pytest.raises(BundleError, match=r"newer==1\.0"):
        b.select_wheels(["newer==1.0"], files, HOST)
    with pytest.raises(BundleError, match=r"vllm==0\.27\.0"):
        b.select_wheels(["vllm==0.27.0"], files, HOST)


# --------------------------------------------------------------------------- build and install


def _wheel(dest: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal, valid pure-Python wheel."""
    info = f"{name}-{version}.dist-info"
    content = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in content.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    content[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, data in content.items():
            z.writestr(p, data)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A two-archive bundle built by ``build`` from local wheels, parts of 4 KiB."""
    root = tmp_path_factory.mktemp("bundle")
    index = root / "index"
    index.mkdir()
    blob = random.Random(7).randbytes(20000)  # incompressible: several 4 KiB parts
    _wheel(
        index,
        "enginepkg",
        "1.0",
        {
            "enginepkg/__init__.py": b"VALUE = 42\n",
            "enginepkg/blob.bin": blob,
            "enginepkg/dropped.a": b"x" * 100,
        },
    )
    _wheel(index, "ledgerdep", "2.0", {"ledgerdep/__init__.py": b"NAME = 'ledgerdep'\n"})
    pins = {
        "host": {**HOST, "python": f"{sys.version_info.major}.{sys.version_info.minor}"},
        "archives": {
            "engine": {"required": True, "wheels": ["enginepkg==1.0"], "prune": ["enginepkg/*.a"]},
            "ledger": {"required": False, "wheels": ["ledgerdep==2.0"]},
        },
    }
    parts = b.build(
        pins,
        root=root / "cache",
        part_bytes=4096,
        index_args=["--no-index", "--find-links", str(index)],
        out=None,
    )
    return {"root": root, "parts": parts, "pins": pins, "blob": blob}


def _copy(parts: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for p in parts.iterdir():
        (dest / p.name).write_bytes(p.read_bytes())
    return dest


def test_build_writes_parts_sums_and_manifest(built: dict[str, Any]) -> None:
    parts: Path = built["parts"]
    manifest = json.loads((parts / b.MANIFEST).read_text())
    engine = manifest["archives"]["engine"]
    assert len(engine["parts"]) >= 2 and engine["pruned"] == ["enginepkg/dropped.a"]
    assert all((parts / p).stat().st_size <= 4096 for p in engine["parts"])
    listed = [line.split("  ")[1] for line in (parts / b.SUMS).read_text().splitlines()]
    assert listed == [*engine["parts"], *manifest["archives"]["ledger"]["parts"], b.MANIFEST]
    assert manifest["key"] == b.bundle_key(built["pins"])
    assert str(parts).startswith(str(built["root"] / "cache"))  # outside any clone


def test_stage_then_install_from_folders(built: dict[str, Any], tmp_path: Path) -> None:
    folders = b.stage(built["parts"], tmp_path / "stash", max_bytes=9000)
    assert [f.name for f in folders][:2] == ["c1", "c2"] and len(folders) >= 2
    assert all(sum(p.stat().st_size for p in f.iterdir()) <= 9000 for f in folders)
    site = tmp_path / "site"
    result = b.install([tmp_path / "stash"], site, out=None)
    assert result["installed"] and result["archives"] == ["engine", "ledger"]
    assert (site / "enginepkg" / "blob.bin").read_bytes() == built["blob"]
    assert (site / "ledgerdep" / "__init__.py").exists()
    assert not (site / "enginepkg" / "dropped.a").exists()
    again = b.install([tmp_path / "stash"], site, out=None)
    assert again["installed"] is False  # the same bundle is already there


def test_optional_archive_left_out_required_one_refused(built: dict[str, Any], tmp_path: Path) -> None:
    site = tmp_path / "site"
    b.install([built["parts"]], site, only=["engine"], out=None)
    assert (site / "enginepkg").is_dir() and not (site / "ledgerdep").exists()
    with pytest.raises(BundleError, match=r"\['engine'\] are required"):
        b.install([built["parts"]], tmp_path / "other", only=["ledger"], out=None)
    assert not (tmp_path / "other").exists()


def test_missing_part_refused_by_name_nothing_written(built: dict[str, Any], tmp_path: Path) -> None:
    stash = _copy(built["parts"], tmp_path / "stash")
    victim = sorted(stash.glob("engine.tar.xz.part-*"))[1]
    victim.unlink()
    with pytest.raises(BundleError, match=rf"missing part\(s\): {victim.name}$"):
        b.install([stash], tmp_path / "site", out=None)
    assert list(tmp_path.iterdir()) == [stash]


@pytest.mark.parametrize("how", ["flipped", "truncated", "sums"])
def test_altered_part_refused_by_name_nothing_written(
    built: dict[str, Any], tmp_path: Path, how: str
) -> None:
    stash = _copy(built["parts"], tmp_path / "stash")
    victim = sorted(stash.glob("engine.tar.xz.part-*"))[-1]
    data = bytearray(victim.read_bytes())
    if how == "flipped":
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
    elif how == "truncated":
        victim.write_bytes(bytes(data[:-1]))
    else:  # a sums file edited to match nothing: the part is still named
        sums = (stash / b.SUMS).read_text().replace(victim.name, victim.name + "x")
        (stash / b.SUMS).write_text(sums)
    expected = (
        rf"missing part\(s\): {victim.name}x" if how == "sums" else rf"altered part\(s\): {victim.name} "
    )
    with pytest.raises(BundleError, match=expected):
        b.install([stash], tmp_path / "site", out=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stash"]


def test_doubled_part_and_foreign_target_refused(built: dict[str, Any], tmp_path: Path) -> None:
    first = _copy(built["parts"], tmp_path / "a")
    second = tmp_path / "b"
    second.mkdir()
    part = sorted(first.glob("engine.tar.xz.part-*"))[0]
    (second / part.name).write_bytes(part.read_bytes())
    with pytest.raises(BundleError, match=f"found more than once: {part.name}"):
        b.install([first, second], tmp_path / "site", out=None)
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    with pytest.raises(BundleError, match="holds something else"):
        b.install([first], occupied, out=None)
    assert (occupied / "keep.txt").read_text() == "mine"


def test_command_line_exit_status(
    built: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stash = _copy(built["parts"], tmp_path / "stash")
    sorted(stash.glob("engine.tar.xz.part-*"))[0].unlink()
    assert b.main(["install", str(stash), "--into", str(tmp_path / "site")]) == 2
    assert "missing part(s): engine.tar.xz.part-000" in capsys.readouterr().err
    assert not (tmp_path / "site").exists()


def test_rebuild_reuses_complete_archives(built: dict[str, Any], tmp_path: Path) -> None:
    # No index at all: a rebuild that tried to download anything would fail.
    empty = tmp_path / "empty"
    empty.mkdir()
    parts = b.build(
        built["pins"],
        root=built["root"] / "cache",
        part_bytes=4096,
        index_args=["--no-index", "--find-links", str(empty)],
        out=None,
    )
    assert (parts / b.SUMS).read_text() == (built["parts"] / b.SUMS).read_text()
    changed = {
        **built["pins"],
        "archives": {
            **built["pins"]["archives"],
            "ledger": {"required": False, "wheels": ["ledgerdep==2.1"]},
        },
    }
    with pytest.raises(BundleError, match="pip download failed"):
        b.build(
            changed,
            root=built["root"] / "cache",
            part_bytes=4096,
            index_args=["--no-index", "--find-links", str(empty)],
            out=None,
        )

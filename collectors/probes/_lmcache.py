"""LMCache as the helper and pool probes use it: found without importing, imported with or without ops.

LMCache resolves ``lmcache.c_ops`` once, at ``import lmcache``: its CUDA
device ops bind the compiled extension when it imports, and otherwise stay on
the torch baseline (``lmcache.v1.platform.torch_ops``), whose
``lmcache_memcpy_async`` copies raw pointers with ``cudaMemcpy`` and no
stream. Masking the extension (a ``None`` entry in ``sys.modules`` before the
import) makes LMCache take that fallback exactly as on an image built without
it. Either state holds for the whole process, so each probe process imports
LMCache one way only.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from typing import Any

from ledger._errors import LedgerError

OPS_MODES = ("present", "masked")
C_OPS = "lmcache.c_ops"


class NoLMCacheError(LedgerError, RuntimeError):
    """LMCache is not importable here; the message starts with ``no LMCache:``."""


def locate() -> dict[str, Any]:
    """Where LMCache is installed and its version, without importing it (raises NoLMCacheError)."""
    try:
        spec = importlib.util.find_spec("lmcache")
    except (ImportError, ValueError) as exc:
        raise NoLMCacheError(f"no LMCache: looking for the lmcache package failed ({exc})") from exc
    if spec is None or not spec.submodule_search_locations:
        raise NoLMCacheError(
            "no LMCache: the lmcache package is not importable "
            f"(sys.path: {', '.join(p for p in sys.path if p)[:300]})"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    try:
        version: str | None = importlib.metadata.version("lmcache")
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version is None:
        version = _version_file(root)
    c_ops = sorted(p.name for p in root.glob("c_ops*.so"))
    return {"version": version, "path": str(root), "c_ops_files": c_ops}


def _version_file(root: Path) -> str | None:
    text = (root / "_version.py").read_text(encoding="utf-8") if (root / "_version.py").exists() else ""
    for line in text.splitlines():
        if line.startswith(("__version__", "version")) and "=" in line:
            return line.split("=", 1)[1].strip().strip("'\"")
    return None


def source_digest(root: str | Path) -> str:
    """SHA-256 over the package's files (relative path and content digest, sorted; caches skipped)."""
    base = Path(root)
    outer = hashlib.sha256()
    for path in sorted(p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        inner = hashlib.sha256(path.read_bytes()).hexdigest()
        outer.update(f"{path.relative_to(base).as_posix()}\0{inner}\n".encode())
    return outer.hexdigest()


def import_lmcache(ops: str) -> dict[str, Any]:
    """Import LMCache with its compiled ops ``present`` or ``masked``; return what it resolved.

    Call once per process, before anything else imports LMCache. Returns the
    version, path, whether the native extension was bound (``with_ops``) and
    which C library the torch fallback's raw-pointer copy would call.
    """
    if ops not in OPS_MODES:
        raise ValueError(f"ops must be one of {OPS_MODES}, got {ops!r}")
    if "lmcache" in sys.modules:
        raise RuntimeError("LMCache is already imported in this process; its ops state is fixed")
    if ops == "masked":
        sys.modules[C_OPS] = None  # type: ignore[assignment]  # the import of the extension fails
    import lmcache
    from lmcache.v1.platform import resolve_device_ops, torch_device_type, torch_ops

    device_ops = resolve_device_ops(torch_device_type)
    # bind_native sets every native op on the instance; the torch baseline leaves them as methods.
    with_ops = "lmcache_memcpy_async" in vars(device_ops)
    root = Path(lmcache.__file__).resolve().parent
    return {
        "version": getattr(lmcache, "__version__", None),
        "path": str(root),
        "ops_requested": ops,
        "with_ops": with_ops,
        "device_ops": type(device_ops).__name__,
        "device_type": str(torch_device_type),
        "copy_lib": _copy_lib_name(torch_ops._get_copy_lib()),
    }


# What a launch records of the LMCache it runs (experiments/targets/vllm/_managed.py): the rule
# of import_lmcache("present"), as a script for that Python, which may lack kvledger's packages.
OPS_STATE_SCRIPT = """\
import json, lmcache
from lmcache.v1.platform import resolve_device_ops, torch_device_type
ops = resolve_device_ops(torch_device_type)
print(json.dumps({"with_ops": "lmcache_memcpy_async" in vars(ops), "device_ops": type(ops).__name__,
                  "device_type": str(torch_device_type), "version": getattr(lmcache, "__version__", None)}))
"""


def _copy_lib_name(lib: Any) -> str | None:
    return None if lib is None else str(getattr(lib, "_name", lib))


def ensure_fallback_copy_lib(cudart_path: str) -> dict[str, Any]:
    """Make the torch fallback's raw copy reach ``cudaMemcpy`` when LMCache's own lookup found no libcudart.

    LMCache finds the runtime with ``ctypes.util.find_library('cudart')``; a
    wheel-installed runtime (``libcudart.so.13`` beside torch) is not on that
    search path, and the fallback would then copy device pointers as host
    memory. Handing it the runtime torch loaded keeps LMCache's code path (a
    stream-less ``cudaMemcpy``) and is recorded as ``copy_lib_injected``.
    """
    from lmcache.v1.platform import torch_ops

    found = torch_ops._get_copy_lib()
    if found is not None and hasattr(found, "cudaMemcpy"):
        return {"copy_lib": _copy_lib_name(found), "copy_lib_injected": False}
    torch_ops._copy_lib = ctypes.CDLL(cudart_path)
    return {"copy_lib": cudart_path, "copy_lib_injected": True, "copy_lib_found_by_lmcache": None}

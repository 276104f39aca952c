"""CUDA access for the probes: availability check, libcudart through ctypes, GPU identity.

torch is imported lazily, inside functions, so this module imports without it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger._errors import LedgerError

CUDA_MEMCPY_DEFAULT = 4  # cudaMemcpyKind cudaMemcpyDefault
CUDA_STREAM_NON_BLOCKING = 0x1  # cudaStreamNonBlocking


class NoCudaError(LedgerError, RuntimeError):
    """No usable CUDA device (torch missing, built without CUDA, or no GPU visible)."""


def require_cuda() -> Any:
    """Return the ``torch`` module if a CUDA device is usable, else raise NoCudaError.

    The message always starts with ``no CUDA device:``.
    """
    try:
        import torch
    except ImportError as exc:
        raise NoCudaError(f"no CUDA device: torch is not installed ({exc})") from exc
    if getattr(torch.version, "cuda", None) is None:
        raise NoCudaError(f"no CUDA device: torch {torch.__version__} is built without CUDA")
    try:
        available = bool(torch.cuda.is_available())
    except Exception as exc:  # driver missing or broken
        raise NoCudaError(f"no CUDA device: torch.cuda.is_available() failed: {exc}") from exc
    if not available:
        raise NoCudaError(
            "no CUDA device: torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    return torch


def _loaded_cudart_paths() -> list[str]:
    paths: list[str] = []
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and "libcudart.so" in os.path.basename(parts[5]):
                path = parts[5].strip()
                if path not in paths:
                    paths.append(path)
    except OSError:
        pass
    return paths


def _candidate_cudart_paths() -> list[tuple[str, str]]:
    """(path, how found), best first: loaded by torch, torch's lib, nvidia wheels, system."""
    found: list[tuple[str, str]] = [(p, "loaded-by-torch") for p in _loaded_cudart_paths()]
    try:
        import torch

        torch_dir = Path(torch.__file__).resolve().parent
        site = torch_dir.parent
        patterns = [
            str(torch_dir / "lib" / "libcudart.so*"),
            str(site / "nvidia" / "*" / "lib" / "libcudart.so*"),
            str(site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so*"),
        ]
        for pattern in patterns:
            for path in sorted(glob.glob(pattern), reverse=True):
                found.append((path, "torch-site-packages"))
    except ImportError:
        pass
    system = ("/usr/local/cuda/lib64/libcudart.so*", "/usr/lib/x86_64-linux-gnu/libcudart.so*")
    for pattern in system:
        for path in sorted(glob.glob(pattern), reverse=True):
            found.append((path, "system"))
    name = ctypes.util.find_library("cudart")
    if name:
        found.append((name, "ld-search"))
    return found


@dataclass
class CudaRuntime:
    """A ctypes handle on libcudart with the few entry points the probes call."""

    lib: ctypes.CDLL
    path: str
    found_by: str

    @classmethod
    def load(cls) -> CudaRuntime:
        errors: list[str] = []
        for path, how in _candidate_cudart_paths():
            try:
                lib = ctypes.CDLL(path)
            except OSError as exc:
                errors.append(f"{path}: {exc}")
                continue
            rt = cls(lib, path, how)
            rt._declare()
            return rt
        raise NoCudaError("no CUDA device: libcudart not found (" + "; ".join(errors) + ")")

    def _declare(self) -> None:
        lib = self.lib
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.cudaMemcpy.restype = ctypes.c_int
        lib.cudaMemcpyAsync.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_void_p,
        ]
        lib.cudaMemcpyAsync.restype = ctypes.c_int
        lib.cudaStreamGetFlags.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint)]
        lib.cudaStreamGetFlags.restype = ctypes.c_int
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        lib.cudaSetDevice.restype = ctypes.c_int
        lib.cudaRuntimeGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.cudaRuntimeGetVersion.restype = ctypes.c_int
        lib.cudaDriverGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.cudaDriverGetVersion.restype = ctypes.c_int
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = self.lib.cudaGetErrorString(rc)
            text = msg.decode() if msg else "unknown"
            raise RuntimeError(f"{what} failed: CUDA error {rc} ({text})")

    @property
    def loaded_by_torch(self) -> bool:
        return self.found_by == "loaded-by-torch"

    def set_device(self, index: int) -> None:
        self.check(self.lib.cudaSetDevice(index), "cudaSetDevice")

    def memcpy(self, dst: int, src: int, nbytes: int) -> None:
        """``cudaMemcpy(dst, src, n, cudaMemcpyDefault)``: no stream argument."""
        self.check(self.lib.cudaMemcpy(dst, src, nbytes, CUDA_MEMCPY_DEFAULT), "cudaMemcpy")

    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """``cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream)``."""
        self.check(
            self.lib.cudaMemcpyAsync(dst, src, nbytes, CUDA_MEMCPY_DEFAULT, stream),
            "cudaMemcpyAsync",
        )

    def stream_flags(self, stream: int) -> int:
        flags = ctypes.c_uint(0)
        self.check(self.lib.cudaStreamGetFlags(stream, ctypes.byref(flags)), "cudaStreamGetFlags")
        return int(flags.value)

    def runtime_version(self) -> str:
        v = ctypes.c_int(0)
        self.check(self.lib.cudaRuntimeGetVersion(ctypes.byref(v)), "cudaRuntimeGetVersion")
        return _fmt_cuda_version(v.value)

    def driver_api_version(self) -> str:
        v = ctypes.c_int(0)
        self.check(self.lib.cudaDriverGetVersion(ctypes.byref(v)), "cudaDriverGetVersion")
        return _fmt_cuda_version(v.value)


def _fmt_cuda_version(value: int) -> str:
    return f"{value // 1000}.{(value % 1000) // 10}"


def driver_version() -> str | None:
    """The NVIDIA driver version (e.g. ``580.159.04``) via NVML, else nvidia-smi."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            raw = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return raw.decode() if isinstance(raw, bytes) else str(raw)
    except Exception:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.strip()
        return out.splitlines()[0].strip() if out else None
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_identity(index: int) -> dict[str, Any]:
    """``{index, name, uuid}`` of one visible GPU, as torch reports it."""
    import torch

    props = torch.cuda.get_device_properties(index)
    raw_uuid = str(getattr(props, "uuid", "") or "")
    prefixed = raw_uuid.startswith(("GPU-", "MIG-"))
    uuid_text = raw_uuid if prefixed or not raw_uuid else f"GPU-{raw_uuid}"
    return {"index": index, "name": props.name, "uuid": uuid_text or None}


def gpus_inventory() -> list[dict[str, Any]]:
    import torch

    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        item = gpu_identity(i)
        item["total_memory_bytes"] = int(props.total_memory)
        item["capability"] = f"{props.major}.{props.minor}"
        item["multiprocessors"] = int(props.multi_processor_count)
        out.append(item)
    return out

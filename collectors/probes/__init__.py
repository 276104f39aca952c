"""GPU byte probes (seed Sections 3.2-3.3): copy ordering, pinned allocation, LMCache's helpers and pool.

Importing this package never imports torch; the probes import it inside
functions and raise :class:`NoCudaError` (message ``no CUDA device: ...``)
where no CUDA device is usable.

API for the ledger CLI (``ledger probe ...``)::

    from collectors.probes import (
        CopyOrderingConfig, PinnedAllocConfig, ProbeRun, NoCudaError,
        run_copy_ordering, run_pinned_alloc, write_jsonl,
    )
    run = run_copy_ordering(CopyOrderingConfig())   # ProbeRun
    run.events     # bare envelopes: run.started, probe.copy x N, run.finished
    run.exit_code  # 0 completed, 1 failed

Command line: ``python -m collectors.probes {copy-ordering,pinned-alloc,helper-probes,pinned-pool}
--jsonl OUT.jsonl``; ``scripts/gpu-probes OUTDIR`` runs the LMCache probes on a GPU host in one go.
The LMCache probes raise :class:`NoLMCacheError` (``no LMCache: ...``) where LMCache is not importable.
"""

from __future__ import annotations

from collectors.probes._cuda import NoCudaError, require_cuda
from collectors.probes._envelope import new_id, utc_now, write_jsonl
from collectors.probes._lmcache import NoLMCacheError
from collectors.probes._run import ProbeRun
from collectors.probes.copy_ordering import (
    CopyOrderingConfig,
    run_copy_ordering,
    run_process_checks,
    summarize,
)
from collectors.probes.lmcache_helpers import HelperProbeConfig, run_helper_probes
from collectors.probes.lmcache_pool import PoolProbeConfig, run_pool_probe
from collectors.probes.pinned_alloc import (
    PinnedAllocConfig,
    measure_pinned_alloc,
    run_pinned_alloc,
)

__all__ = [
    "CopyOrderingConfig",
    "HelperProbeConfig",
    "NoCudaError",
    "NoLMCacheError",
    "PinnedAllocConfig",
    "PoolProbeConfig",
    "ProbeRun",
    "measure_pinned_alloc",
    "new_id",
    "require_cuda",
    "run_copy_ordering",
    "run_helper_probes",
    "run_pinned_alloc",
    "run_pool_probe",
    "run_process_checks",
    "summarize",
    "utc_now",
    "write_jsonl",
]

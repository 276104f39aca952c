"""FIXTURE records for the LMCache helper and pool probes: made here, not measured.

They stand in for tests/data/probes/helper_probes.jsonl and pinned_pool.jsonl
until records of a real GPU run are committed there; the tests read the real
files whenever they exist and say which they read. The shape is the probes'
own (the same ``_event_data`` builds each event from a child's rows); the
values follow the seed's expectation (the lazy allocator's raw fallback fails
when the producer is delayed, every other path passes; torch rounds a pinned
pool just over a power of two when LMCache has no compiled ops) and are not
evidence of anything.
"""

from __future__ import annotations

from typing import Any

from collectors.probes import lmcache_helpers as helpers
from collectors.probes import lmcache_pool as pool
from collectors.probes._envelope import envelope, new_id

HOST = {"hostname": "FIXTURE", "cpu": "none", "gpus": [{"index": 0, "name": "NVIDIA H200",
        "uuid": "GPU-00000000-0000-0000-0000-f1c7f1c7f1c7"}]}  # fmt: skip
GPU = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-00000000-0000-0000-0000-f1c7f1c7f1c7"}
STARTED = {"script_sha256": "0" * 64, "seed": None, "code": {"commit": "fixture", "dirty": True},
           "packages": {"python": "3.12.3", "torch": "2.11.0", "lmcache": "0.5.3"}, "host": HOST}  # fmt: skip


def helper_events() -> list[dict[str, Any]]:
    config = helpers.HelperProbeConfig()
    run_id = new_id()
    events = [envelope("run.started", {**STARTED, "experiment": helpers.EXPERIMENT,
                                       "params": {**config.params(), "fixture": True}}, run_id)]  # fmt: skip
    for ops in config.ops_modes:
        with_ops = ops == "present"
        facts = {"pid": 1, "torch_version": "2.11.0+cu130", "cuda_runtime_version": "13.0", "gpu": GPU,
                 "lmcache": {"version": "0.5.3", "with_ops": with_ops, "source_sha256": "f" * 64,
                             "copy_lib": "libcudart.so.13", "copy_lib_injected": False}}  # fmt: skip
        base = {"ops_requested": ops, "driver_version": "580.159.04", "lmcache_version": "0.5.3",
                "torch_version": "2.11.0+cu130", "gpu": GPU}  # fmt: skip
        for cell in config.cells():
            lazy = cell["allocator"] == "lazy"
            bad = lazy and not with_ops and cell["delay_cycles"] > 0
            row = {**cell, "helper": helpers.HELPERS[cell["direction"]],
                   "copy": helpers._copy_name(lazy, with_ops), "host_pinned": True, "error": None,
                   "mismatching_bytes": cell["bytes"] if bad else 0, "first_bad_offset": 0 if bad else None,
                   "copy_landed_bad_bytes": 0,
                   "seconds": 0.05 if cell["delay_cycles"] else 0.001}  # fmt: skip
            events.append(envelope(helpers.KIND, helpers._event_data(row, facts, base), run_id))
    checks = len(events) - 1
    events.append(envelope("run.finished", {"status": "completed", "error": None, "seconds": 24.0,
                                            "checks": checks, "errored_checks": 0,
                                            "checks_per_second": round(checks / 24.0, 3),
                                            "summary": helpers.summarize(events)}, run_id))  # fmt: skip
    return events


def pool_events() -> list[dict[str, Any]]:
    config = pool.PoolProbeConfig()
    run_id = new_id()
    events = [envelope("run.started", {**STARTED, "experiment": pool.EXPERIMENT,
                                       "params": {**config.params(), "fixture": True}}, run_id)]  # fmt: skip
    for setting in config.settings():
        ops, conf = setting["ops"], setting["alloc_conf"]
        var, value = pool.split_alloc_conf(conf)
        refused = conf is not None and "max_round" in conf
        with_ops = ops == "present"
        lm = {} if refused else {"version": "0.5.3", "with_ops": with_ops, "source_sha256": "f" * 64}
        for n in setting["sizes"]:
            if refused:
                row = {"bytes_requested": n, "is_pinned": False, "bytes_reserved": None, "seconds": 0.0004,
                       "error": "ValueError: Unrecognized key 'pinned_max_round_threshold_mb' in CUDA "
                                "allocator config.", "failed_at": "cuda-init"}  # fmt: skip
            else:
                reserved = n if ops == "present" else pool.next_power_of_two(n + 4096)
                row = {"bytes_requested": n, "is_pinned": True, "bytes_reserved": reserved,
                       "seconds": round(n / 2.5e9, 3), "error": None, "failed_at": None,
                       "allocator": "MixedMemoryAllocator"}  # fmt: skip
            data = pool._event_data(row, lm, ops, conf, var, value, {"pid": 2, "gpu": GPU},
                                    {"version": "0.5.3"}, "2.11.0+cu130", "580.159.04")  # fmt: skip
            events.append(envelope(pool.KIND, data, run_id))
    events.append(envelope("run.finished", {"status": "completed", "error": None, "seconds": 110.0,
                                            "pools": len(events) - 1, "skipped": []}, run_id))  # fmt: skip
    return events

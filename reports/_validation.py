"""Validation layers (the seed's Table 2) and which ON configurations they cover.

- byte probes (``probe.copy``): pass when every check of the ordered copy
  methods passed; the raw fallback is diagnostic (it is expected to fail
  when delayed) and only shown;
- pinned allocation (``probe.pinned_alloc``): passes when an allocation came
  back pinned without error (whether it was rounded up is shown, not judged:
  the seed's failure was the fallback to pageable memory);
- service regression (``validation`` runs): a config digest passes when a
  validation run for it finished ``completed`` with every assertion passed.

Probes test the GPU copy path, not one config, so they cover every ON config
whose ``transfer_path`` is ``gpu``; for ``sim`` and ``cpu`` paths they do not
apply and read "not applicable" (never "missing"). A launch that does not say
its path (older records) is treated as ``gpu``: the gate cannot prove the
probes unnecessary. The audit's ``validation-missing`` reads the same
:func:`config_coverage`, so the table and the gate always agree.
"""

from __future__ import annotations

from typing import Any

from ._source import Source
from ._views import ORDERED_METHODS

GPU_PATH = "gpu"
# Paths on which the GPU byte and pinned-allocation probes apply ("unknown": not recorded).
GPU_LAYER_PATHS = frozenset({GPU_PATH, "unknown"})
PASS, MISSING, NOT_APPLICABLE = "pass", "missing", "not applicable"
GPU_LAYERS = ("byte probes (copy ordering)", "pinned allocation")


def copy_probes(src: Source) -> dict[str, Any]:
    rows = src.rows_once("""SELECT method, direction, delayed, sum(checks) AS checks, sum(passed) AS passed,
                              list(DISTINCT run_id ORDER BY run_id) AS runs
                       FROM kv_probe_copy GROUP BY ALL ORDER BY method, direction, delayed""")
    ordered = [r for r in rows if r["method"] in ORDERED_METHODS]
    methods_seen = {r["method"] for r in ordered}
    passed = (
        bool(ordered)
        and methods_seen == set(ORDERED_METHODS)
        and all(int(r["checks"]) == int(r["passed"]) for r in ordered)
    )
    return {
        "layer": "byte probes (copy ordering)",
        "applies_to": "transfer_path gpu",
        "cells": [
            {**r, "checks": int(r["checks"]), "passed": int(r["passed"]), "runs": list(r["runs"])}
            for r in rows
        ],
        "checks": sum(int(r["checks"]) for r in ordered),
        "passed_checks": sum(int(r["passed"]) for r in ordered),
        "passed": passed,
        "note": "ordered methods must pass every check; raw_fallback is diagnostic",
    }


def pinned_probes(src: Source) -> dict[str, Any]:
    rows = src.rows_once("""SELECT run_id, bytes_requested, is_pinned, seconds, alloc_conf, rounded_up, error
                       FROM kv_probe_pinned ORDER BY seq""")
    # Pinned is the property (the seed's failure was a pageable fallback); rounding is shown, not judged.
    good = [r for r in rows if r["is_pinned"] and not r["error"]]
    return {
        "layer": "pinned allocation",
        "applies_to": "transfer_path gpu",
        "allocations": rows,
        "checks": len(rows),
        "passed_checks": len(good),
        "passed": bool(good),
    }


def service_regression(src: Source) -> dict[str, Any]:
    rows = src.rows_once("""SELECT run_id, config_sha256, finish_status, assertions, passed, ok
                            FROM kv_validation ORDER BY seq""")
    return {
        "layer": "service regression",
        "applies_to": "every transfer path",
        "runs": rows,
        "checks": sum(int(r["assertions"]) for r in rows),
        "passed_checks": sum(int(r["passed"]) for r in rows),
        "configs_passed": sorted({r["config_sha256"] for r in rows if r["ok"] and r["config_sha256"]}),
    }


def config_coverage(
    src: Source,
    run: str | None,
    probes_ok: bool,
    pinned_ok: bool,
    services_ok: set[str],
    per_run: bool = False,
) -> list[dict[str, Any]]:
    """Per ON config in scope: each layer ``pass``, ``missing`` or ``not applicable``.

    ``per_run``: one entry per (run, config) with the paths that run launched it on
    (the audit's findings are per run), in one query however many runs there are.
    """
    group = "run_id, config_sha256" if per_run else "config_sha256"
    rows = src.rows(
        f"""SELECT {group}, list(DISTINCT transfer_path ORDER BY transfer_path) AS paths,
                              list(DISTINCT run_id ORDER BY run_id) AS runs
                       FROM kv_on_configs WHERE ($run IS NULL OR run_id = $run)
                       GROUP BY {group} ORDER BY {group}""",
        {"run": run},
    )
    out = []
    for r in rows:
        gpu = bool(GPU_LAYER_PATHS & set(r["paths"]))
        layers = {"service regression": PASS if r["config_sha256"] in services_ok else MISSING}
        for name, ok in zip(GPU_LAYERS, (probes_ok, pinned_ok), strict=True):
            layers[name] = (PASS if ok else MISSING) if gpu else NOT_APPLICABLE
        out.append(
            {
                "config_sha256": r["config_sha256"],
                "transfer_paths": list(r["paths"]),
                "runs": list(r["runs"]),
                "layers": layers,
                "missing": [name for name, state in layers.items() if state == MISSING],
                "passed": all(state != MISSING for state in layers.values()),
            }
        )
    return out


def _status(layer: dict[str, Any], applicable: bool) -> str:
    if not applicable:
        return NOT_APPLICABLE
    return PASS if layer["passed"] else "not passed"


def validation_layers(src: Source, run: str | None) -> dict[str, Any]:
    copy, pinned, service = copy_probes(src), pinned_probes(src), service_regression(src)
    coverage = config_coverage(src, run, copy["passed"], pinned["passed"], set(service["configs_passed"]))
    # A GPU layer applies when some ON config in scope moves KV over a GPU path; with no
    # performance config in scope (a ledger of probes alone) it applies when it was run.
    gpu_configs = [c for c in coverage if c["layers"][GPU_LAYERS[0]] != NOT_APPLICABLE]
    for layer in (copy, pinned):
        applicable = bool(gpu_configs) if coverage else bool(layer["checks"])
        layer["applicable"] = applicable
        layer["status"] = _status(layer, applicable)
        if not applicable:
            paths = sorted({p for c in coverage for p in c["transfer_paths"]})
            layer["applicability"] = (
                f"GPU transfer paths only; ON configs here use {'/'.join(paths)}"
                if paths
                else "GPU transfer paths only; no ON configuration in scope"
            )
    service["passed"] = bool(service["configs_passed"]) and all(
        c["layers"]["service regression"] == PASS for c in coverage
    )
    service["applicable"] = True
    service["status"] = _status(service, True)
    return {"layers": [copy, pinned, service], "configs": coverage}

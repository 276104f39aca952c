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
whose ``transfer_path`` is ``gpu``; for other paths they do not apply.
"""

from __future__ import annotations

from typing import Any

from ._source import Source
from ._views import ORDERED_METHODS

GPU_PATH = "gpu"


def copy_probes(src: Source) -> dict[str, Any]:
    rows = src.rows("""SELECT method, direction, delayed, sum(checks) AS checks, sum(passed) AS passed,
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
    rows = src.rows("""SELECT run_id, bytes_requested, is_pinned, seconds, alloc_conf, rounded_up, error
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
    rows = src.rows("""SELECT run_id, config_sha256, finish_status, assertions, passed, ok FROM kv_validation
                       ORDER BY seq""")
    return {
        "layer": "service regression",
        "applies_to": "every transfer path",
        "runs": rows,
        "checks": sum(int(r["assertions"]) for r in rows),
        "passed_checks": sum(int(r["passed"]) for r in rows),
        "configs_passed": sorted({r["config_sha256"] for r in rows if r["ok"] and r["config_sha256"]}),
    }


def config_coverage(
    src: Source, run: str | None, probes_ok: bool, pinned_ok: bool, services_ok: set[str]
) -> list[dict[str, Any]]:
    """Per ON config in scope: which layers apply and whether each has passed."""
    rows = src.rows(
        """SELECT config_sha256, list(DISTINCT transfer_path ORDER BY transfer_path) AS paths,
                              list(DISTINCT run_id ORDER BY run_id) AS runs
                       FROM kv_on_configs WHERE ($run IS NULL OR run_id = $run)
                       GROUP BY config_sha256 ORDER BY config_sha256""",
        {"run": run},
    )
    out = []
    for r in rows:
        gpu = GPU_PATH in r["paths"]
        layers = {"service regression": r["config_sha256"] in services_ok}
        if gpu:
            layers["byte probes (copy ordering)"] = probes_ok
            layers["pinned allocation"] = pinned_ok
        out.append(
            {
                "config_sha256": r["config_sha256"],
                "transfer_paths": list(r["paths"]),
                "runs": list(r["runs"]),
                "layers": layers,
                "passed": all(layers.values()),
            }
        )
    return out


def validation_layers(src: Source, run: str | None) -> dict[str, Any]:
    copy, pinned, service = copy_probes(src), pinned_probes(src), service_regression(src)
    coverage = config_coverage(src, run, copy["passed"], pinned["passed"], set(service["configs_passed"]))
    return {"layers": [copy, pinned, service], "configs": coverage}

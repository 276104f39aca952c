"""Validation layers (the seed's Table 2) and which ON configurations they cover.

Four layers, as the seed validated its transfer path:

- byte probes (``probe.copy``): pass when every check of the ordered copy
  methods passed; the raw fallback is diagnostic (it is expected to fail
  when delayed) and only shown;
- runtime helpers (``probe.helper``): LMCache's own allocators and GPU copy
  helpers. A configuration is covered by the checks of its LMCache version,
  allocator and transfer path (and compiled-ops state, when its launch names
  it); any failed check fails it, errored checks leave it unproven;
- pinned allocation (``probe.pinned`` for LMCache's pool, else
  ``probe.pinned_alloc`` for torch's allocator): judged by
  :func:`judge_pinned`: memory reserved must stay within
  :func:`pinned_tolerance` of memory requested, at every size probed,
  unmitigated or under a recorded setting that demonstrably brings it there.
  A setting that torch refused is an observation, not a result;
- service regression (``validation`` runs): a config digest passes when a
  validation run for it finished ``completed`` with every assertion passed.

Probes are tied to the configs they cover, not counted ledger-wide: the GPU
layers apply only where an ON config's ``transfer_path`` is ``gpu`` (a launch
that does not say is treated as ``gpu``: the gate cannot prove the probes
unnecessary), and the helper and LMCache pool layers only to configs whose
launch names the same LMCache version (and allocator). The audit's
``validation-missing``, ``pinned-rounding`` and ``helper-probe-failed`` read
the same functions, so the table and the gate always agree.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from ._source import Source
from ._views import ORDERED_METHODS

GPU_PATH = "gpu"
# Paths on which the GPU probes apply ("unknown": not recorded).
GPU_LAYER_PATHS = frozenset({GPU_PATH, "unknown"})
PASS, MISSING, FAILED, NOT_APPLICABLE = "pass", "missing", "failed", "not applicable"
BYTES = "byte probes (copy ordering)"
HELPERS = "runtime helpers (LMCache)"
PINNED = "pinned allocation"
SERVICE = "service regression"
GPU_LAYERS = (BYTES, HELPERS, PINNED)

# Rule 1: reserved may exceed requested by at most this (alignment and allocator headers, not rounding).
PINNED_TOLERANCE_FRACTION = 0.01
PINNED_TOLERANCE_MIN_BYTES = 2 * 1024 * 1024
TOLERANCE_TEXT = "max(2 MiB, 1 % of requested)"


def pinned_tolerance(requested: int) -> int:
    return max(PINNED_TOLERANCE_MIN_BYTES, int(requested * PINNED_TOLERANCE_FRACTION))


def within_tolerance(requested: int, reserved: int | None) -> bool:
    return reserved is not None and reserved <= requested + pinned_tolerance(requested)


# --------------------------------------------------------------------------------------------
# Evidence


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
        "layer": BYTES,
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


def helper_cells(src: Source) -> list[dict[str, Any]]:
    """The helper checks per path cell (kv_probe_helper), all runs."""
    rows = src.rows_once("""SELECT run_id, lmcache_version, allocator, with_ops, copy, transfer_path,
                                   direction, delayed, bytes, checks, passed, failed, errored,
                                   first_bad_offset, max_mismatching_bytes, gpus
                            FROM kv_probe_helper
                            ORDER BY lmcache_version, allocator, with_ops, direction, delayed, bytes,
                                     run_id""")
    return [
        {
            **r,
            "checks": int(r["checks"]),
            "passed": int(r["passed"]),
            "failed": int(r["failed"]),
            "errored": int(r["errored"]),
            "gpus": list(r["gpus"] or []),
        }
        for r in rows
    ]


def helper_paths(cells: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Cells folded per path: LMCache version, allocator, ops state, copy branch, direction, delay."""
    paths: dict[tuple[Any, ...], dict[str, Any]] = {}
    for c in cells:
        key = (c["lmcache_version"], c["allocator"], c["with_ops"], c["copy"], c["direction"], c["delayed"])
        p = paths.setdefault(
            key,
            {
                "lmcache_version": c["lmcache_version"],
                "allocator": c["allocator"],
                "with_ops": c["with_ops"],
                "copy": c["copy"],
                "direction": c["direction"],
                "delayed": c["delayed"],
                "checks": 0,
                "passed": 0,
                "failed": 0,
                "errored": 0,
                "first_bad_offset": None,
                "gpus": set(),
                "runs": set(),
            },
        )
        for k in ("checks", "passed", "failed", "errored"):
            p[k] += c[k]
        offsets = [x for x in (p["first_bad_offset"], c["first_bad_offset"]) if x is not None]
        p["first_bad_offset"] = min(offsets, default=None)
        p["gpus"].update(c["gpus"])
        p["runs"].add(c["run_id"])
    return [{**p, "gpus": sorted(p["gpus"]), "runs": sorted(p["runs"])} for p in paths.values()]


def helper_probes(src: Source) -> dict[str, Any]:
    cells = helper_cells(src)
    paths = helper_paths(cells)
    failed = [p for p in paths if p["failed"]]
    return {
        "layer": HELPERS,
        "applies_to": "transfer_path gpu, same LMCache version and allocator",
        "cells": cells,
        "paths": paths,
        "checks": sum(c["checks"] for c in cells),
        "passed_checks": sum(c["passed"] for c in cells),
        "failed_paths": failed,
        "passed": bool(cells) and not failed and not any(c["errored"] for c in cells),
        "note": "a failed check fails the configs of its LMCache version and allocator",
    }


def pinned_rows(src: Source) -> list[dict[str, Any]]:
    """Pinned evidence, one row per allocation: LMCache's pool (probe.pinned), torch's (pinned_alloc)."""
    pool = src.rows_once("""SELECT run_id, seq, 'lmcache pool' AS source, lmcache_version, with_ops,
                                   bytes_requested, bytes_reserved, is_pinned, seconds, alloc_conf, error,
                                   failed_at, setting
                            FROM kv_probe_pool ORDER BY seq""")
    torch = src.rows_once("""SELECT run_id, seq, 'torch host allocator' AS source,
                                    NULL::VARCHAR AS lmcache_version, NULL::BOOLEAN AS with_ops,
                                    bytes_requested, bytes_reserved, is_pinned, seconds, alloc_conf, error,
                                    failed_at, NULL::VARCHAR AS setting
                             FROM kv_probe_pinned ORDER BY seq""")
    return [dict(r) for r in (*pool, *torch)]


def _series_key(r: Mapping[str, Any]) -> tuple[Any, ...]:
    return (r["source"], r["lmcache_version"], r["with_ops"])


def series_name(key: tuple[Any, ...]) -> str:
    source, version, with_ops = key
    if source != "lmcache pool":
        return "torch host allocator"
    ops = "compiled ops" if with_ops else ("no compiled ops" if with_ops is False else "ops unknown")
    return f"LMCache {version or '?'} local CPU pool ({ops})"


def judge_pinned(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rule 1, per series (source, LMCache version, ops state) and size requested.

    A size passes when some allocation of it came back pinned, without error,
    with reserved within :func:`pinned_tolerance` of requested; unmitigated
    (``alloc_conf`` null) if possible, else under the setting named in
    ``mitigation``. Settings torch refused (``failed_at`` ``cuda-init``) are
    listed as ``refused``. A failing size keeps the unmitigated allocation as
    its evidence (requested and reserved bytes).
    """
    by_size: dict[tuple[Any, ...], list[Mapping[str, Any]]] = defaultdict(list)
    refusals: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    for r in rows:
        if r["failed_at"] == "cuda-init":  # torch refused the setting before LMCache loaded: any ops state
            refusals[(r["source"], r["lmcache_version"], int(r["bytes_requested"]))].add(str(r["alloc_conf"]))
        else:
            by_size[(*_series_key(r), int(r["bytes_requested"]))].append(r)
    out = []
    for key, allocations in sorted(by_size.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        refused = sorted(refusals.get((key[0], key[1], key[-1]), set()))
        tried = allocations
        good = [
            r
            for r in tried
            if r["is_pinned"]
            and not r["error"]
            and within_tolerance(int(r["bytes_requested"]), r["bytes_reserved"])
        ]
        unmitigated = [r for r in tried if r["alloc_conf"] is None]
        evidence = (unmitigated or tried)[0]
        best = next((r for r in good if r["alloc_conf"] is None), good[0] if good else None)
        requested = int(key[-1])
        reserved = evidence["bytes_reserved"]
        out.append(
            {
                "series": series_name(key[:-1]),
                "source": key[0],
                "lmcache_version": key[1],
                "with_ops": key[2],
                "bytes_requested": requested,
                "bytes_reserved": None if reserved is None else int(reserved),
                "is_pinned": bool(evidence["is_pinned"]),
                "error": evidence["error"],
                "passed": best is not None,
                "mitigation": None if best is None else best["alloc_conf"],
                "tried": sorted({str(r["alloc_conf"]) if r["alloc_conf"] else "none" for r in tried}),
                "refused": refused,
                "run_id": (best or evidence)["run_id"],
                "runs": sorted({r["run_id"] for r in allocations}),
            }
        )
    return out


def pinned_probes(src: Source) -> dict[str, Any]:
    sizes = judge_pinned(pinned_rows(src))
    return {
        "layer": PINNED,
        "applies_to": "transfer_path gpu (LMCache's pool: same LMCache version)",
        "sizes": sizes,
        "allocations": pinned_rows(src),
        "checks": len(sizes),
        "passed_checks": sum(1 for s in sizes if s["passed"]),
        "passed": bool(sizes) and all(s["passed"] for s in sizes),
        "tolerance": TOLERANCE_TEXT,
        "note": f"reserved must stay within {TOLERANCE_TEXT} of requested at every size",
    }


def service_regression(src: Source, contradicted: Collection[str] = ()) -> dict[str, Any]:
    """The validation runs and the configs they pass. ``contradicted``: validation runs with a check
    recorded as passed that its observations fail (the audit's re-derivations): they pass nothing."""
    rows = src.rows_once("""SELECT run_id, config_sha256, finish_status, assertions, passed, ok
                            FROM kv_validation ORDER BY seq""")
    return {
        "layer": SERVICE,
        "applies_to": "every transfer path",
        "runs": rows,
        "checks": sum(int(r["assertions"]) for r in rows),
        "passed_checks": sum(int(r["passed"]) for r in rows),
        "configs_passed": sorted(
            {
                r["config_sha256"]
                for r in rows
                if r["ok"] and r["config_sha256"] and r["run_id"] not in contradicted
            }
        ),
    }


# --------------------------------------------------------------------------------------------
# Per configuration


def _matches(cfg: Mapping[str, Any], version: Any, with_ops: Any) -> bool:
    if version != cfg["lmcache_version"]:
        return False
    return cfg["lmcache_ops"] is None or with_ops == cfg["lmcache_ops"]


def config_helper_paths(cfg: Mapping[str, Any], paths: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The helper paths that cover one config: its LMCache version, allocator (and ops state if named)."""
    return [
        dict(p)
        for p in paths
        if p["allocator"] == cfg["lmcache_allocator"] and _matches(cfg, p["lmcache_version"], p["with_ops"])
    ]


def _helper_state(cfg: Mapping[str, Any], paths: list[dict[str, Any]]) -> tuple[str, str | None]:
    if not cfg["lmcache_version"] or not cfg["lmcache_allocator"]:
        return MISSING, "its launch does not name the LMCache version and allocator"
    mine = config_helper_paths(cfg, paths)
    if not mine:
        version, allocator = cfg["lmcache_version"], cfg["lmcache_allocator"]
        return MISSING, f"no helper checks of LMCache {version} with the {allocator} allocator"
    if any(p["failed"] for p in mine):
        return FAILED, None
    if any(p["errored"] for p in mine):
        return MISSING, "helper checks errored"
    return PASS, None


def _pinned_state(cfg: Mapping[str, Any], sizes: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    # LMCache's own pool of the config's version is the specific evidence; torch's allocator otherwise.
    pool = [s for s in sizes if s["source"] == "lmcache pool"]
    mine = [s for s in pool if _matches(cfg, s["lmcache_version"], s["with_ops"])]
    if not mine:
        mine = [s for s in sizes if s["source"] != "lmcache pool"]
    if not mine:
        return MISSING, []
    return (PASS if all(s["passed"] for s in mine) else FAILED), mine


def config_pinned_sizes(cfg: Mapping[str, Any], sizes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pinned-allocation sizes that judge one config (its LMCache pool's, else torch's)."""
    return _pinned_state(cfg, sizes)[1]


def config_coverage(
    src: Source,
    run: str | None,
    probes_ok: bool,
    helper_paths_all: list[dict[str, Any]],
    pinned_sizes: list[dict[str, Any]],
    services_ok: set[str],
    per_run: bool = False,
    services_contradicted: Collection[str] = (),
) -> list[dict[str, Any]]:
    """Per ON config in scope: each layer ``pass``, ``failed``, ``missing`` or ``not applicable``.

    ``per_run``: one entry per (run, config) with the paths that run launched it on
    (the audit's findings are per run), in one query however many runs there are.
    """
    group = "run_id, config_sha256" if per_run else "config_sha256"
    rows = src.rows(
        f"""SELECT {group}, list(DISTINCT transfer_path ORDER BY transfer_path) AS paths,
                   list(DISTINCT run_id ORDER BY run_id) AS runs,
                   any_value(lmcache_version) AS lmcache_version,
                   any_value(lmcache_allocator) AS lmcache_allocator, any_value(lmcache_ops) AS lmcache_ops
            FROM kv_on_configs WHERE ($run IS NULL OR run_id = $run)
            GROUP BY {group} ORDER BY {group}""",
        {"run": run},
    )
    out = []
    for r in rows:
        cfg = dict(r)
        gpu = bool(GPU_LAYER_PATHS & set(r["paths"]))
        layers: dict[str, str] = {}
        notes: dict[str, str] = {}
        if gpu:
            layers[BYTES] = PASS if probes_ok else MISSING
            layers[HELPERS], note = _helper_state(cfg, helper_paths_all)
            if note:
                notes[HELPERS] = note
            layers[PINNED], _ = _pinned_state(cfg, pinned_sizes)
        else:
            layers.update({name: NOT_APPLICABLE for name in GPU_LAYERS})
        layers[SERVICE] = PASS if r["config_sha256"] in services_ok else MISSING
        if layers[SERVICE] == MISSING and r["config_sha256"] in services_contradicted:
            notes[SERVICE] = "its validation run passed it as recorded, but its checks' observations fail it"
        out.append(
            {
                "config_sha256": r["config_sha256"],
                "transfer_paths": list(r["paths"]),
                "runs": list(r["runs"]),
                "lmcache_version": r["lmcache_version"],
                "lmcache_allocator": r["lmcache_allocator"],
                "lmcache_ops": r["lmcache_ops"],
                "layers": layers,
                "notes": notes,
                "missing": [name for name, state in layers.items() if state in (MISSING, FAILED)],
                "passed": all(state in (PASS, NOT_APPLICABLE) for state in layers.values()),
            }
        )
    return out


def coverage(
    src: Source, run: str | None, per_run: bool = False, contradicted: Collection[str] = ()
) -> tuple[dict[str, Any], ...]:
    """The four layers' evidence and the configs they cover: (copy, helpers, pinned, service, configs).
    ``contradicted``: validation runs that pass nothing (see :func:`service_regression`)."""
    copy, helpers = copy_probes(src), helper_probes(src)
    pinned, service = pinned_probes(src), service_regression(src, contradicted)
    refused = {r["config_sha256"] for r in service["runs"] if r["ok"] and r["run_id"] in contradicted}
    configs = config_coverage(
        src,
        run,
        copy["passed"],
        helpers["paths"],
        pinned["sizes"],
        set(service["configs_passed"]),
        per_run=per_run,
        services_contradicted=refused,
    )
    return copy, helpers, pinned, service, {"configs": configs}


def _status(layer: dict[str, Any], applicable: bool) -> str:
    if not applicable:
        return NOT_APPLICABLE
    return PASS if layer["passed"] else "not passed"


def validation_layers(src: Source, run: str | None) -> dict[str, Any]:
    copy, helpers, pinned, service, scope = coverage(src, run)
    configs = scope["configs"]
    # A GPU layer applies when some ON config in scope moves KV over a GPU path; with no
    # performance config in scope (a ledger of probes alone) it applies when it was run.
    gpu_configs = [c for c in configs if c["layers"][BYTES] != NOT_APPLICABLE]
    for layer in (copy, helpers, pinned):
        applicable = bool(gpu_configs) if configs else bool(layer["checks"])
        if gpu_configs and layer is not copy:
            # Tied to configs: the layer passes when it passes for every GPU config in scope.
            layer["passed"] = all(c["layers"][layer["layer"]] == PASS for c in gpu_configs)
        layer["applicable"] = applicable
        layer["status"] = _status(layer, applicable)
        if not applicable:
            paths = sorted({p for c in configs for p in c["transfer_paths"]})
            layer["applicability"] = (
                f"GPU transfer paths only; ON configs here use {'/'.join(paths)}"
                if paths
                else "GPU transfer paths only; no ON configuration in scope"
            )
    service["passed"] = bool(service["configs_passed"]) and all(c["layers"][SERVICE] == PASS for c in configs)
    service["applicable"] = True
    service["status"] = _status(service, True)
    return {"layers": [copy, helpers, pinned, service], "configs": configs}

"""A GPU config's coverage from the LMCache helper and pool records (real, or FIXTURE until committed).

The records are read by tests/probes/test_helper_data.py's loader, which says
which it read. A synthetic GPU screening names LMCache 0.5.3 in its launches;
the allocator and ops state it names decide which records cover it.
"""

from __future__ import annotations

from typing import Any

import pytest

from reports import audit, derive_report
from reports._synthetic import Shape, generate
from reports._validation import HELPERS as HELPER_LAYER
from reports._validation import PINNED
from tests.probes.test_helper_data import checks_of, load


@pytest.fixture(scope="module")
def helper_run() -> tuple[list[dict[str, Any]], str]:
    return load("helper_probes.jsonl")


@pytest.fixture(scope="module")
def pool_run() -> tuple[list[dict[str, Any]], str]:
    return load("pinned_pool.jsonl")


@pytest.mark.parametrize(
    ("allocator", "ops"), [("mixed", None), ("lazy", False), ("lazy", True), ("lazy", None)]
)
def test_coverage_of_a_gpu_config_from_these_records(
    build_lite: Any, helper_run: tuple[list[dict[str, Any]], str], pool_run: tuple[list[dict[str, Any]], str],
    allocator: str, ops: bool | None,
) -> None:  # fmt: skip
    synthetic, _ = generate(shape=Shape(target="vllm", transfer_path="gpu"))
    probe_runs = {e["run_id"] for e in synthetic if e["kind"] == "run.started"
                  and e["data"]["experiment"].startswith("probe.")}  # fmt: skip
    events = [*helper_run[0], *pool_run[0], *(e for e in synthetic if e["run_id"] not in probe_runs)]
    for e in events:
        if e["kind"] == "deployment.launched" and e["data"].get("lmcache_version"):
            e["data"] = {**e["data"], "lmcache_allocator": allocator, "lmcache_ops": ops}
    src = build_lite(events)
    (cfg,) = derive_report(src)["tables"]["validation"]["configs"]
    codes = {f.code for f in audit(src)}
    fails = any(not d["passed"] for d in checks_of(helper_run)
                if d["allocator"] == allocator and (ops is None or d["with_ops"] == ops))  # fmt: skip
    assert (cfg["layers"][HELPER_LAYER] == "failed") is fails, helper_run[1]
    assert ("helper-probe-failed" in codes) is (allocator == "lazy" and fails), helper_run[1]
    if allocator == "mixed":
        assert cfg["layers"][HELPER_LAYER] == "pass", helper_run[1]
    if ops is False:  # without compiled ops LMCache's pool rounds: configs naming that state fail
        assert cfg["layers"][PINNED] == "failed" and "pinned-rounding" in codes, pool_run[1]

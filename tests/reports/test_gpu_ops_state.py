"""The GPU layers judge an ON config by the copy path its launch says LMCache ran.

On the one-H200 study's own probes (``tests/data/gpu-mp-32k``), LMCache 0.5.3 is
right with its compiled ops and wrong without them: the lazy allocator's raw
``cudaMemcpy`` fallback returns stale bytes when the producer stream is late, and
the pool without ops reserves twice the bytes requested. That study's launches
predate the ops record, so both failures count against its config. A launch
that records ``lmcache.ops`` (the vllm target observes it as each ON block
starts) is judged by the probes of that state only, so the same probes pass a
config with ops and fail one without, and their findings block only the latter.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

import pytest

from reports import audit, derive_report
from reports._validation import FAILED, HELPERS, PASS, PINNED

STUDY = Path(__file__).resolve().parents[1] / "data" / "gpu-mp-32k" / "ledger.jsonl.xz"
SEALING = ("seq", "digest", "chain")


def _envelopes(ops: bool | None) -> list[dict[str, Any]]:
    """The study's validation, screening and probe runs as bare envelopes (its needle evaluations,
    two thirds of its events and no ON config, left out), the ON launches recording ``ops``
    (None: as they ran)."""
    with lzma.open(STUDY, "rt") as lines:
        events = [{k: v for k, v in json.loads(line).items() if k not in SEALING} for line in lines]
    needle = {
        e["run_id"] for e in events if e["kind"] == "run.started" and e["data"]["experiment"] == "needle_eval"
    }
    out = [e for e in events if e["run_id"] not in needle]
    for e in out:
        if ops is not None and e["kind"] == "deployment.launched" and e["data"]["arm"] == "ON":
            e["data"]["lmcache"]["ops"] = ops
    return out


@pytest.mark.parametrize(
    ("ops", "helpers", "pinned", "passed"),
    [(None, FAILED, FAILED, False), (False, FAILED, FAILED, False), (True, PASS, PASS, True)],
    ids=["not-recorded", "without-ops", "with-ops"],
)
def test_the_gpu_layers_follow_the_recorded_ops_state(
    build_lite: Any, ops: bool | None, helpers: str, pinned: str, passed: bool
) -> None:
    src = build_lite(_envelopes(ops))
    (cfg,) = derive_report(src)["tables"]["validation"]["configs"]
    assert cfg["lmcache_ops"] is ops and cfg["lmcache_allocator"] == "lazy"
    assert (cfg["layers"][HELPERS], cfg["layers"][PINNED], cfg["passed"]) == (helpers, pinned, passed)
    codes = {f.code for f in audit(src)}
    assert ("validation-missing" in codes) is not passed
    # The probes' findings are tied to the config too: the pool's rounding without ops, and the
    # lazy allocator's stale bytes, block only a config that ran that path (or does not say).
    assert ("helper-probe-failed" in codes) is (helpers == FAILED)
    assert ("pinned-rounding" in codes) is (pinned == FAILED)

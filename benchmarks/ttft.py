"""TTFT measurement overhead of the collectors client, and of GuideLLM, on loopback.

``python -m benchmarks ttft [--requests N] [--time-scale X] [--skip-guidellm]``

The sim serves one replica in a SUBPROCESS (its own interpreter and GIL) and
records, per request, the wall-clock time (CLOCK_REALTIME) at which it wrote
the first token (``GET /sim/requests``, ``t_first_emit_unix``). The client
records the wall-clock time at which the first content token arrived. Both
are measured from the same send, so

    overhead = client-observed TTFT - server's first-token time
             = client first-token wall time - server first-emit wall time

is how late the measuring client dates a token the server has already sent.
Measured at 1, 16 and 64 concurrent streams (closed loop: each stream sends
its next request when the previous one ends), p50 and p99.

Two figures for the collectors client: ``p99_ms_N`` uses its recorded
arrival time (on Linux the kernel's receive stamp of the read, see
``collectors._http``: what the client reports as TTFT), ``read_p99_ms_N`` the
time its read returned to Python (what a user-space stamp would give: it adds
the client process's scheduling delay and event-loop queueing, which on a
busy 2-core machine dominate). GuideLLM's figure is of the latter kind.
``loadavg_start``/``loadavg_end`` record ``os.getloadavg()``.

GuideLLM (PyPI ``guidellm``, pinned, in its own venv under
``~/.cache/kvledger/peers/guidellm``, created on first use: it pulls torch)
is driven against the same server at the same concurrency with
``--profile concurrent``; its per-request first-token times are matched to
the server's log by response id. It needs a tokenizer for synthetic
prompts; a local one (the tiny model's, or a small BPE trained here) is used,
so it runs offline. If it cannot run, the reason is printed and its figures
are null. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from collectors import RequestSpec, send_request

LEVELS = (1, 16, 64)
PEER_VENV = Path.home() / ".cache" / "kvledger" / "peers" / "guidellm"
OUTPUT_TOKENS = 16


class _NullSink:
    """Keeps the events in memory: the benchmark measures the client, not the ledger."""

    def __init__(self) -> None:
        self.count = 0

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        self.count += 1


def _pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return s[k]


def start_sim(time_scale: float) -> tuple[subprocess.Popen[str], str]:
    """The sim deployment (one replica, no tier traffic) in a subprocess; its replica URL."""
    cmd = [
        sys.executable,
        "-m",
        "experiments.targets.sim",
        "--replicas",
        "1",
        "--shared",
        "off",
        "--time-scale",
        str(time_scale),
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline().strip()
        if not line and proc.poll() is not None:
            break
        if line == "READY":
            return proc, lines[0]
        lines.append(line)
    proc.kill()
    raise RuntimeError(f"the sim did not start: {lines}")


def _prompt(i: int) -> str:
    return f"request {i}: " + " ".join(f"w{(i * 7 + k) % 97}" for k in range(100))


async def _server_log(client: httpx.AsyncClient, url: str) -> dict[str, dict[str, Any]]:
    log = (await client.get(url + "/sim/requests")).json()
    out: dict[str, dict[str, Any]] = {}
    for e in log:
        out[e["request_id"]] = e
        out[e["response_id"]] = e
    return out


async def measure_ours(url: str, concurrency: int, requests: int) -> dict[str, Any]:
    """Closed-loop streams through collectors.send_request; overheads in ms."""
    sink = _NullSink()
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        counter = iter(range(requests + concurrency))  # + warm-up, one per stream

        def make(i: int) -> RequestSpec:
            body = {
                "model": "sim-27b",
                "prompt": _prompt(i),
                "max_tokens": OUTPUT_TOKENS,
                "ignore_eos": True,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            return RequestSpec(f"bench-{concurrency}-{i}", url, "/v1/completions", body, {})

        outcomes = []

        async def stream(warm: bool) -> None:
            if warm:  # opens this stream's connection; not measured
                await send_request(client, make(next(counter)), sink)
            for i in counter:
                outcomes.append(await send_request(client, make(i), sink))

        await asyncio.gather(*(stream(True) for _ in range(concurrency)))
        log = await _server_log(client, url)
        await client.delete(url + "/sim/requests")
    lags, reads, errors = [], [], 0
    for o in outcomes:
        entry = log.get(o.request_id)
        if not o.ok or o.first_wall_ns is None or entry is None or entry["t_first_emit_unix"] is None:
            errors += 1
            continue
        lags.append((o.first_wall_ns / 1e9 - entry["t_first_emit_unix"]) * 1e3)
        reads.append(((o.first_read_wall_ns or o.first_wall_ns) / 1e9 - entry["t_first_emit_unix"]) * 1e3)
    out = _summary(lags, errors)
    read = _summary(reads, errors)
    out["read_p50_ms"], out["read_p99_ms"] = read["p50_ms"], read["p99_ms"]
    return out


def _summary(lags: list[float], errors: int) -> dict[str, Any]:
    if not lags:
        return {"n": 0, "errors": errors, "p50_ms": None, "p99_ms": None}
    return {
        "n": len(lags),
        "errors": errors,
        "p50_ms": round(statistics.median(lags), 4),
        "p99_ms": round(_pct(lags, 99), 4),
        "max_ms": round(max(lags), 4),
        "min_ms": round(min(lags), 4),
    }


# --- GuideLLM ---------------------------------------------------------------


GUIDELLM_PIN = "guidellm==0.8.1"
_TOKENIZER_DIR = PEER_VENV.parent / "guidellm-tokenizer"
_BUILD_TOKENIZER = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
words = [f"w{i} value {i * 7919 % 1000003} of the file, line {i}." for i in range(20000)]
tok.train_from_iterator(words, trainer)
PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(sys.argv[1])
"""


def _tail(proc: subprocess.CompletedProcess[str] | subprocess.CalledProcessError) -> str:
    lines = [
        ln
        for ln in ((proc.stderr or "") + (proc.stdout or "")).splitlines()
        if ln.strip() and not ln.startswith("WARNING: Location")
    ]
    return " | ".join(lines[-3:])


def ensure_guidellm() -> tuple[Path | None, str]:
    """GuideLLM's executable, installing it (pinned) into its own venv on first use; else the reason."""
    exe = PEER_VENV / "bin" / "guidellm"
    if exe.exists():
        return exe, ""
    print(f"installing {GUIDELLM_PIN} into {PEER_VENV} (first run only; it pulls torch, minutes)", flush=True)
    py = PEER_VENV / "bin" / "python"
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(PEER_VENV)],
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", GUIDELLM_PIN],
    ]
    for cmd in steps:
        try:
            subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=True)
        except subprocess.CalledProcessError as exc:
            return None, f"could not install {GUIDELLM_PIN} into {PEER_VENV}: {_tail(exc)}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"could not install {GUIDELLM_PIN} into {PEER_VENV}: {exc}"
    return (exe, "") if exe.exists() else (None, f"{GUIDELLM_PIN} installed no {exe}")


def _local_processor() -> tuple[Path | None, str]:
    """A local Hugging Face tokenizer directory (GuideLLM runs offline), built here if need be."""
    env = os.environ.get("KVLEDGER_TOKENIZER")
    if env:
        return Path(env), ""
    models = Path.home() / ".cache" / "kvledger" / "models"
    for tok in sorted(models.glob("*/tokenizer.json")) if models.exists() else []:
        return tok.parent, ""
    if (_TOKENIZER_DIR / "tokenizer.json").exists():
        return _TOKENIZER_DIR, ""
    # A small byte-level BPE, trained here with the peer venv's own tokenizers/transformers.
    proc = subprocess.run(
        [str(PEER_VENV / "bin" / "python"), "-c", _BUILD_TOKENIZER, str(_TOKENIZER_DIR)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0 or not (_TOKENIZER_DIR / "tokenizer.json").exists():
        return None, f"no local tokenizer for guidellm and building one failed: {_tail(proc)}"
    return _TOKENIZER_DIR, ""


def measure_guidellm(
    url: str, concurrency: int, requests: int, work: Path
) -> tuple[dict[str, Any] | None, str]:
    """GuideLLM's concurrent profile against the same server; lags matched by response id."""
    exe, why = ensure_guidellm()
    if exe is None:
        return None, why
    processor, why = _local_processor()
    if processor is None:
        return None, why
    # GuideLLM loads the tokenizer named like the served model: a local directory of that name.
    link = work / "sim-27b"
    if not link.exists():
        link.symlink_to(processor)
    out = work / f"guidellm-{concurrency}.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    cmd = [
        str(exe),
        "run",
        "--backend",
        f"kind=openai_http,target={url},model=sim-27b,request_format=/v1/completions",
        "--profile",
        f"kind=concurrent,streams={concurrency}",
        "--constraint",
        f"kind=max_requests,count={requests}",
        "--tokenizer",
        "kind=hf_auto",
        "--data",
        f"kind=synthetic_text,prompt_tokens=100,output_tokens={OUTPUT_TOKENS}",
        "--output",
        f"kind=json,path={out}",
        "--disable-progress",
    ]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=900, env=env, cwd=work, check=False
        )
    except subprocess.TimeoutExpired:
        return None, "guidellm timed out"
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return None, f"guidellm exited {proc.returncode}: {' | '.join(tail)}"
    return _match_guidellm(json.loads(out.read_text()), url), ""


def _match_guidellm(report: Any, url: str) -> dict[str, Any]:
    async def fetch() -> dict[str, dict[str, Any]]:
        async with httpx.AsyncClient() as c:
            log = await _server_log(c, url)
            await c.delete(url + "/sim/requests")
            return log

    log = asyncio.run(fetch())
    lags, errors = [], 0
    for bench in report.get("benchmarks", []):
        for r in bench.get("requests", {}).get("successful", []):
            first = ((r.get("info") or {}).get("timings") or {}).get("first_token_iteration")
            entry = log.get(str(r.get("response_id")))
            if entry is None or first is None or entry["t_first_emit_unix"] is None:
                errors += 1
                continue
            lags.append((float(first) - entry["t_first_emit_unix"]) * 1e3)
    return _summary(lags, errors)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks ttft", description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=640, help="measured requests per level")
    ap.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="sim time scale (1.0: 15 ms prefill overhead, 20 ms per output token)",
    )
    ap.add_argument("--skip-guidellm", action="store_true")
    args = ap.parse_args()

    proc, url = start_sim(args.time_scale)
    result: dict[str, Any] = {
        "server": url,
        "time_scale": args.time_scale,
        "output_tokens": OUTPUT_TOKENS,
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        for level in LEVELS:
            n = max(args.requests, 4 * level) if level > 1 else max(200, args.requests // 2)
            ours = asyncio.run(measure_ours(url, level, n))
            print(f"collectors  {level:>2} streams: {ours}")
            result[f"p50_ms_{level}"] = ours["p50_ms"]
            result[f"p99_ms_{level}"] = ours["p99_ms"]
            result[f"read_p50_ms_{level}"] = ours["read_p50_ms"]
            result[f"read_p99_ms_{level}"] = ours["read_p99_ms"]
            result[f"n_{level}"] = ours["n"]
        reason = "skipped (--skip-guidellm)" if args.skip_guidellm else ""
        with tempfile.TemporaryDirectory() as tmp:
            for level in LEVELS:
                if reason:
                    result[f"guidellm_p50_ms_{level}"] = result[f"guidellm_p99_ms_{level}"] = None
                    continue
                n = max(args.requests, 4 * level) if level > 1 else max(200, args.requests // 2)
                g, why = measure_guidellm(url, level, n, Path(tmp))
                if g is None or not g["n"]:
                    reason = why or f"no guidellm request could be matched to the server log ({g})"
                    result[f"guidellm_p50_ms_{level}"] = result[f"guidellm_p99_ms_{level}"] = None
                    continue
                print(f"guidellm    {level:>2} streams: {g}")
                result[f"guidellm_p50_ms_{level}"] = g["p50_ms"]
                result[f"guidellm_p99_ms_{level}"] = g["p99_ms"]
        if reason:
            print(f"guidellm not measured: {reason}")
        result["guidellm_reason"] = reason or None
    finally:
        proc.terminate()
        proc.wait(10)
    p99, peer = result.get("p99_ms_64"), result.get("guidellm_p99_ms_64")
    result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["goal_p99_le_1ms"] = p99 is not None and p99 <= 1.0
    result["goal_below_guidellm"] = None if peer is None or p99 is None else p99 < peer
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

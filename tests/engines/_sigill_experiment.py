"""An experiment for the fault test: the worker of one replica dies by SIGILL after HTTP 200.

A fresh replica whose first request was a cross-replica hit was seen to die
with SIGILL after answering HTTP 200 (experiments/targets/vllm/NOTES.md). That
did not reproduce here, so the death is injected: replica ``victim``'s engine worker process (a
descendant of its API server, found through /proc) is stopped before the cross-replica request is
sent, and once the engine has taken the request in (its HTTP 200 out, the stream not ended) it gets
SIGILL. Everything else is the ordinary runner path: warmups on every replica, single-request
windows, checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

PARAMS: dict[str, Any] = {
    "namespace_tag": None,
    "size": 1000,
    "victim": 1,
    "victim_pid": None,  # the victim's API server pid; None: the managed target's own process
    "stream_tokens": 2800,  # with the prompt (about 1,000 tokens) inside max_model_len 4096
    "kill_after_s": 0.0,
    "warmup_tokens": 300,
    "stop_on_block_failure": True,
}


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def engine_worker(api_pid: int) -> tuple[int, str]:
    """The replica's worker (``VLLM::Worker``), else its engine core: (pid, title)."""
    seen, todo = [], [api_pid]
    while todo:
        kids = _children(todo.pop())
        seen += kids
        todo += kids
    for title in ("VLLM::Worker", "VLLM::EngineCore"):
        for pid in seen:
            if _cmdline(pid).startswith(title):
                return pid, title
    raise RuntimeError(f"no engine process under {api_pid}: {[(p, _cmdline(p)) for p in seen]}")


def _metric(text: str, name: str) -> float:
    """The sum of a Prometheus metric's samples over its labels (0.0 when absent)."""
    prefixes = (name + "{", name + " ")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefixes))


async def _kill_when_streaming(ctx: Any, replica: int, pid: int, title: str, delay: float) -> None:
    """SIGILL to the replica's engine process ``pid`` (stopped before the request was sent) once the
    engine has taken the request in."""
    url = ctx.target.endpoint(replica)
    # The engine has the request once /metrics counts it waiting or running: the server sent its
    # HTTP 200 before the body's first read, which hands the request to the engine. The process runs
    # only 10 ms at a time between two looks, so the stream cannot end before the signal. Watching
    # a running engine instead raced the stream's end under load: this client, starved of CPU, took
    # 6 s to read one /metrics answer while the server streamed all 2,800 tokens.
    while True:
        text = (await ctx.client.get(url + "/metrics")).text
        if _metric(text, "vllm:num_requests_running") + _metric(text, "vllm:num_requests_waiting") > 0:
            break
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)  # blocking on purpose: the window must not stretch with this loop's load
        os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(0.02)
    await asyncio.sleep(delay)
    os.kill(pid, signal.SIGILL)
    os.kill(pid, signal.SIGCONT)  # the SIGILL sent to a stopped process is delivered on SIGCONT
    # The ledger says what was injected: this death is the test's doing, not the engine's.
    ctx.sink.emit_run(
        "note.added",
        {
            "text": f"fault injected: SIGILL to {title} pid {pid} of replica {replica} "
            "once it had taken the request in",
            "topic": "fault-injection",
            "replica": replica,
            "process": title,
        },
    )


async def run(ctx: Any) -> None:
    p = ctx.params
    (spec,) = ctx.block_plan(1, ["ON"], gpu_swap=False)

    async def block(b: Any) -> None:
        await b.warmups(0, p["warmup_tokens"])  # real engines: every replica still gets one
        victim, other = p["victim"], 1 - p["victim"]
        ns = ctx.namespace("micro", p["size"], "c0")
        fx = await ctx.fixture(ctx.fixture_key("micro", 0), p["size"], ns)
        await b.request(
            fx.messages,
            replica=other,
            namespace=ns,
            workload="micro",
            step="cold",
            key="micro/cold",
            fixture=fx,
            prompt_tokens=fx.prompt_tokens,
        )
        # The victim's engine process, stopped before the request leaves (the scrapes around it
        # read the API server's own /metrics, which a stopped engine does not hold up).
        api_pid = p["victim_pid"] or ctx.target.process(victim).pid
        pid, title = engine_worker(api_pid)
        os.kill(pid, signal.SIGSTOP)
        killer = asyncio.create_task(_kill_when_streaming(ctx, victim, pid, title, p["kill_after_s"]))
        try:
            await b.request(
                fx.messages,
                replica=victim,
                namespace=ns,
                workload="micro",
                step="cross",
                key="micro/cross",
                fixture=fx,
                prompt_tokens=fx.prompt_tokens,
                max_tokens=p["stream_tokens"],
                ignore_eos=True,
            )
        finally:
            killer.cancel()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # never left stopped, whatever ended the request
        # Not reached when the replica died: the block has failed.
        await b.request(
            fx.messages,
            replica=victim,
            namespace=ns,
            workload="micro",
            step="receiver_local",
            key="micro/receiver_local",
            fixture=fx,
        )

    await ctx.run_blocks([spec], block)

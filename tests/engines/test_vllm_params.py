"""The vllm target's options, command rendering and secret handling (no engines needed)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from collectors._secrets import REDACTED, redact_env
from experiments import needle
from experiments._params import ParamError
from experiments.targets.sim import SimDeployment
from experiments.targets.vllm import _argv_templates as cmds
from experiments.targets.vllm._managed import VllmTarget
from experiments.targets.vllm._resolve import Resolved, resolve
from experiments.targets.vllm._settings import PARAMS, Settings, check, parse_attach, parse_gpus
from experiments.targets.vllm.target import check_params, make_target
from ledger import open_ledger

from .._cli import ledger_cli

HF = "hf_" + "AbCdEfGhIjKlMnOpQrSt"  # secret-shaped, not a real token
SK = "sk-" + "live0123456789abcdefXYZ"


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("replicas=1", "at least 2"),
        ("gpus=a,b", "gpus must be integers"),
        ("gpus=0", "1 GPU(s) for 2 replicas"),
        ("max_model_len=0", "positive integer"),
        ("chunk_size=-256", "positive integer"),
        (f'env={{"HF_TOKEN": "{HF}"}}', "pass_env"),
        (f'env={{"MIRROR": "https://user:{SK}@mirror.example"}}', "pass_env"),
        (f'env={{"NOTE": "{SK}"}}', "pass_env"),
        ('env={"A": 1}', "JSON object of strings"),
        ('pass_env="HF_TOKEN"', "must be list"),
        (f'extra_args=["--api-key", "{SK}"]', "looks secret"),
        ('replica_command=["{python}", "{nope}"]', "unknown placeholder"),
        ('service_command="lmcache server"', "must be a list"),
        ("attach=ftp://x", "http(s) URLs"),
        (f"attach=http://u:{SK}@h:1,http://h:2", "credentials"),
        ("model=/nonexistent/checkpoint", "not a directory"),
        ("vllm_python=/nonexistent/python", "not found"),
        ("stop_grace_s=0", "> 0"),
        ("cpu_worker_in_engine=1", "cpu_worker_in_engine must be bool"),
        ("no_such_option=1", "unknown param"),
    ],
)
def test_bad_params_exit_2_and_write_nothing(tmp_path: Path, param: str, message: str) -> None:
    db = tmp_path / "ledger.db"
    result = ledger_cli(
        "run", "screening", "--target", "vllm", "--db", f"sqlite:///{db}", "--no-progress", "--param", param
    )
    assert result.exit_code == 2, result.output
    assert message in result.output
    if db.exists():
        led = open_ledger(f"sqlite:///{db}")
        try:
            assert list(led.events()) == []
        finally:
            led.close()


def test_params_checked_directly() -> None:
    good = dict(PARAMS)
    check_params(good)  # the defaults are valid
    with pytest.raises(ParamError, match="pass_env"):
        check_params({**good, "env": {"WANDB_API_KEY": "x"}})
    assert parse_gpus("0, 1") == (0, 1) and parse_gpus([2, 3]) == (2, 3) and parse_gpus(None) is None
    assert parse_attach("http://a:1/,http://b:2,service=http://s:3/") == (
        ("http://a:1", "http://b:2"),
        "http://s:3",
        None,
    )
    assert parse_attach("http://a:1,service_metrics=http://s:9/,service=http://s:3") == (
        ("http://a:1",),
        "http://s:3",
        "http://s:9",
    )
    with pytest.raises(ParamError, match="service_metrics"):
        parse_attach("http://a:1,service_metrics=s:9")
    with pytest.raises(ParamError):
        check({**good, "gpus": [-1, 0]})


def test_replica_command_renders_one_argument_per_item() -> None:
    template = cmds.replica_template(enforce_eager=True, block_size=16, gpu_memory_utilization=0.8)
    argv = cmds.render(
        template,
        {
            "python": "/envs/vllm/bin/python",
            "model": Path("/models/my model"),
            "served_name": "m",
            "host": "127.0.0.1",
            "port": 8001,
            "dtype": "bfloat16",
            "max_model_len": 4096,
            "block_size": 16,
        },
    )
    assert argv[:3] == ["/envs/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == "/models/my model"  # a path with a space stays one arg
    assert argv[argv.index("--port") + 1] == "8001" and "--enforce-eager" in argv
    assert argv[argv.index("--block-size") + 1] == "16"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.8"
    on = cmds.with_connector(argv, cmds.kv_transfer_config("127.0.0.1", 5555))
    assert on[-2] == "--kv-transfer-config"
    assert json.loads(on[-1]) == {
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1", "lmcache.mp.port": 5555},
    }
    service = cmds.render(
        cmds.SERVICE_TEMPLATE,
        {"python": "py", "host": "h", "port": 1, "metrics_port": 3, "chunk_size": 256, "l1_size_gb": 1},
    )
    assert "--supported-transfer-mode" in service and service[service.index("--chunk-size") + 1] == "256"
    with pytest.raises(ParamError, match="unknown placeholder"):
        cmds.render(["{python}", "{gpu}"], {"python": "py"})


def _target(tmp_path: Path, engine_device: str = "cuda", **params: Any) -> VllmTarget:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    resolved = Resolved(
        "/envs/vllm/bin/python",
        "/envs/lmcache/bin/python",
        model,
        None,
        "r1",
        "0.32.0",
        "0.5.6",
        tiny=True,
        engine_device=engine_device,
    )
    return VllmTarget(Settings({**PARAMS, **params}), resolved)


def test_a_cpu_engine_runs_its_model_in_the_engine_process_unless_told_not_to(tmp_path: Path) -> None:
    """vLLM's CPU platform starts a worker process of its own per replica unless
    VLLM_ENABLE_V1_MULTIPROCESSING is 0; the default sets it (as vLLM runs one GPU), the setting
    is part of the config, and neither a GPU replica nor the LMCache service gets it."""
    one, two = _target(tmp_path, "cpu"), _target(tmp_path, "cpu", cpu_worker_in_engine=False)
    assert one._env(None)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in two._env(None)
    assert one.config("OFF")["cpu_worker_in_engine"] is True
    assert two.config("OFF")["cpu_worker_in_engine"] is False
    assert one.config_sha256("OFF") != two.config_sha256("OFF")
    gpu = _target(tmp_path)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in gpu._env(0)
    assert gpu.config("OFF")["cpu_worker_in_engine"] is None


def test_config_digest_is_stable_and_arm_specific(tmp_path: Path) -> None:
    a, b = _target(tmp_path), _target(tmp_path)
    assert a.config_sha256("ON") == b.config_sha256("ON") != a.config_sha256("OFF")
    assert a.config("OFF")["kv_connector"] is None and a.config("ON")["service"]["chunk_size"] == 256
    assert _target(tmp_path, chunk_size=512).config_sha256("ON") != a.config_sha256("ON")
    assert _target(tmp_path, env={"VLLM_ATTENTION_BACKEND": "X"}).config_sha256("ON") != a.config_sha256("ON")
    assert not a.answers_meaningful  # the tiny random-weight model
    assert a.meaningful_up_to_tokens is None and a.model_name == "tiny"
    assert _target(tmp_path, answers_meaningful=True).answers_meaningful
    # ports and pids change per launch, never the digest
    assert "port" not in json.dumps(a.config("ON"))


def test_the_needle_models_card_limits_exact_checks_to_the_sizes_it_serves(tmp_path: Path) -> None:
    card = needle.load_card()
    resolved = Resolved(
        "/envs/vllm/bin/python",
        "/envs/lmcache/bin/python",
        needle.CHECKPOINT,
        needle.MANIFEST,
        "needle-x",
        "0.32.0",
        "0.5.6",
        tiny=False,
        card=card,
        default_name="needle",
    )
    t = VllmTarget(Settings(dict(PARAMS)), resolved)
    assert t.answers_meaningful and t.model_name == "needle"
    assert t.meaningful_up_to_tokens == card.served_max_tokens
    assert t.model_card is not None and t.model_card["served_max_tokens"] == card.served_max_tokens
    # Sizes measured above the served range are declared, by the card's own figures.
    assert t.model_card["unserved"] == {str(n): a for n, a in card.unserved().items()}
    assert t.describe()["meaningful_up_to_tokens"] == card.served_max_tokens
    # Said explicitly, answers_meaningful overrides the card (the evaluation checks every size).
    forced = VllmTarget(Settings({**PARAMS, "answers_meaningful": True}), resolved)
    assert forced.meaningful_up_to_tokens is None
    assert resolved.audit.matched is True  # the committed checkpoint against its manifest


def test_the_default_model_is_the_needle_model_and_tiny_is_still_there() -> None:
    check_params({**PARAMS, "model": "tiny"})  # not a directory, but the engines' tiny model
    r = resolve(
        Settings(
            {
                **PARAMS,
                "engine_version": "0.32.0",
                "service_version": "0.5.6",
                "vllm_python": sys.executable,
                "lmcache_python": sys.executable,
            }
        )
    )
    assert r.model_dir == needle.CHECKPOINT and r.manifest == needle.MANIFEST and not r.tiny
    assert r.card is not None and r.default_name == "needle" and (r.revision or "").startswith("needle-")
    assert r.audit.matched is True
    # Named by its path (as scripts do), it is still the needle model, with its manifest and card.
    by_path = resolve(
        Settings(
            {
                **PARAMS,
                "engine_version": "0.32.0",
                "service_version": "0.5.6",
                "vllm_python": sys.executable,
                "lmcache_python": sys.executable,
                "model": str(needle.CHECKPOINT),
            }
        )
    )
    assert by_path.card == r.card and by_path.manifest == needle.MANIFEST and by_path.revision == r.revision


def test_passed_secrets_reach_the_process_but_not_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", HF)
    monkeypatch.setenv("KVL_MIRROR_URL", f"https://user:{SK}@mirror.example/simple")
    t = _target(
        tmp_path, pass_env=["HF_TOKEN", "KVL_MIRROR_URL", "NOT_SET_ANYWHERE"], env={"KVL_NOTE": "plain"}
    )
    env = t._env(None)
    assert env["HF_TOKEN"] == HF and SK in env["KVL_MIRROR_URL"] and env["KVL_NOTE"] == "plain"
    assert "NOT_SET_ANYWHERE" not in env and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    recorded = json.dumps(redact_env(env))
    assert HF not in recorded and SK not in recorded and "plain" in recorded
    assert redact_env(env)["HF_TOKEN"] == REDACTED
    assert redact_env(env)["KVL_MIRROR_URL"] == f"https://user:{REDACTED}@mirror.example/simple"
    gpu_env = t._env(3)
    assert gpu_env["CUDA_VISIBLE_DEVICES"] == "3" and "VLLM_CPU_KVCACHE_SPACE" not in gpu_env


# A stand-in replica: notes that it started (on which GPU), then dies before it is healthy.
_DIES_AT_START = (
    "import os, sys, time, pathlib; "
    "pathlib.Path(sys.argv[1], 'gpu' + os.environ['CUDA_VISIBLE_DEVICES'] + '-port' + sys.argv[2]).touch(); "
    "time.sleep(1.0); sys.exit(1)"
)


@pytest.mark.parametrize(
    ("gpus", "started", "first_failure"),
    [("0,0", ["gpu0"], "replica-0"), ("0,1", ["gpu0", "gpu1"], "replica-[01]")],
    ids=["one-gpu", "two-gpus"],
)
def test_replicas_that_share_a_gpu_start_one_after_another(
    tmp_path: Path, gpus: str, started: list[str], first_failure: str
) -> None:
    """vLLM sizes its KV cache from what its start-up profile saw used on the GPU, so a replica
    started beside another on the same GPU counts the other's memory as its own and can be left
    none. Replicas sharing a GPU start one after another (a failed first one stops the block
    before the second starts); on separate GPUs they start together."""
    import asyncio

    from experiments.targets._base import TargetError

    notes = tmp_path / "started"
    notes.mkdir()
    settings = Settings(
        {
            **PARAMS,
            "gpus": gpus,
            "replica_command": [sys.executable, "-c", _DIES_AT_START, str(notes), "{port}"],
            "logs_dir": str(tmp_path / "logs"),
        }
    )
    resolved = Resolved(
        vllm_python=sys.executable,
        lmcache_python=sys.executable,
        model_dir=tmp_path,
        manifest=None,
        revision=None,
        engine_version="0",
        service_version=None,
        tiny=True,
    )
    target = VllmTarget(settings, resolved)

    async def block() -> None:
        try:
            await target.start(arm="OFF", gpus=[0, 1])
        finally:
            await target.stop()
            await target.close()

    # Started together, either replica may be seen to exit first.
    with pytest.raises(TargetError, match=f"{first_failure} exited with 1"):
        asyncio.run(block())
    seen = sorted(p.name.split("-")[0] for p in notes.iterdir())
    assert seen == started


def test_an_attached_services_metrics_are_the_on_blocks_tier() -> None:
    # Endpoints someone else started (the sim's replicas and its shared tier, which speak as
    # vLLM and LMCache's service do): the URL named service_metrics is what the runner scrapes
    # as the tier around every window of an ON block; an OFF block shares through nothing.
    with SimDeployment(2, shared=True, time_scale=0.001) as dep:
        urls = ",".join(dep.replica_urls)
        plain = make_target({**PARAMS, "attach": urls})
        tiered = make_target({**PARAMS, "attach": f"{urls},service_metrics={dep.shared_url}"})

        async def launches() -> list[str | None]:
            try:
                return [
                    (await plain.start(arm="ON", gpus=[])).tier_metrics,
                    (await tiered.start(arm="ON", gpus=[])).tier_metrics,
                    (await tiered.start(arm="OFF", gpus=[])).tier_metrics,
                ]
            finally:
                await plain.close()
                await tiered.close()

        assert asyncio.run(launches()) == [None, dep.shared_url, None]

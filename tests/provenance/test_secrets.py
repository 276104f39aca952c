"""Secrets never reach a launch record: redaction by name and by value shape."""

from __future__ import annotations

from collectors._secrets import REDACTED, redact_command, redact_env, redact_tree


def test_secret_names_are_redacted() -> None:
    env = {
        "HF_TOKEN": "abc",
        "OPENAI_API_KEY": "x",
        "DB_PASSWORD": "p",
        "AWS_SECRET_ACCESS_KEY": "s",
        "PATH": "/usr/bin",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "MONKEY_BUSINESS": "ok",
    }
    out = redact_env(env)
    assert out["HF_TOKEN"] == out["OPENAI_API_KEY"] == out["DB_PASSWORD"] == REDACTED
    assert out["AWS_SECRET_ACCESS_KEY"] == REDACTED
    assert out["PATH"] == "/usr/bin" and out["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert out["MONKEY_BUSINESS"] == "ok"


def test_secret_shaped_values_are_redacted_under_innocent_names() -> None:
    env = {
        "X": "hf_" + "a" * 30,
        "Y": "sk-" + "b" * 40,
        "Z": "ghp_" + "c" * 36,
        "U": "postgresql://alice:hunter2@db:5432/test",
        "W": "AKIA" + "D" * 16,
    }
    out = redact_env(env)
    assert "a" * 30 not in str(out) and "b" * 40 not in str(out) and "c" * 36 not in str(out)
    assert "hunter2" not in out["U"] and out["U"].startswith("postgresql://alice:")
    assert out["W"] == REDACTED


def test_commands_hide_flag_values_and_shaped_arguments() -> None:
    argv = [
        "python",
        "-m",
        "vllm",
        "--api-key",
        "s3cret",
        "--hf-token=hf_" + "z" * 20,
        "--model",
        "/models/tiny",
        "--url",
        "https://u:pw@example.invalid/x",
    ]
    out = redact_command(argv)
    assert "s3cret" not in out and all("z" * 20 not in a for a in out)
    assert "/models/tiny" in out and out[out.index("--api-key") + 1] == REDACTED
    assert all("pw@" not in a for a in out)


def test_a_server_self_description_is_redacted_at_any_depth() -> None:
    # The shape of vLLM's /server_info: a config, its VLLM_* environment, the host's.
    info = {
        "vllm_config": "model=/m, served_model_name=needle",
        "vllm_env": {"VLLM_SERVER_DEV_MODE": "1", "VLLM_API_TOKEN": "t0ps3cret", "VLLM_PORT": 8000},
        "system_env": {
            "pip_packages": ["a==1", "url=https://bob:pw@example.org/x"],
            "nested": [{"x": "hf_" + "z" * 20}],
        },
    }
    out = redact_tree(info)
    assert out["vllm_env"]["VLLM_API_TOKEN"] == REDACTED
    assert out["vllm_env"]["VLLM_SERVER_DEV_MODE"] == "1" and out["vllm_env"]["VLLM_PORT"] == 8000
    assert out["system_env"]["pip_packages"] == ["a==1", f"url=https://bob:{REDACTED}@example.org/x"]
    assert out["system_env"]["nested"] == [{"x": REDACTED}]
    assert out["vllm_config"] == info["vllm_config"]
    assert info["vllm_env"]["VLLM_API_TOKEN"] == "t0ps3cret"  # a copy: the input is left alone

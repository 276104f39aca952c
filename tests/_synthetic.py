"""Synthetic, screening-shaped event streams with plantable flaws.

Produces bare envelopes (``id, ts, kind, run_id, block_id, data``) that follow
docs/api-contract.md's event conventions: a screening run of blocks in the
order OFF–ON–ON–OFF with micro chains, sessions, forced-length generation and
concurrency windows (the seed's 192 measured requests and six warmups per
block), a validation run of the ON configuration, and, for ``transfer_path
"gpu"``, copy-ordering and pinned-allocation probe runs.

Used by tests/reports (each audit code has a :class:`Flaws` switch) and by
``python -m benchmarks report`` (:func:`stream` scales to millions of events).
Everything is deterministic given the seed: ids and timestamps come from a
counter, values from :class:`random.Random`.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

Envelope = dict[str, Any]

SIZES = (8192, 32768, 131072, 262144)
SESSION_SIZES = (32768, 131072)
PLACEMENTS = ("fixed", "alternating")
GEN_CELLS = tuple((n, s, m) for n in (8192, 131072) for s in ("cold", "hot") for m in (512, 2048))
WINDOW_SESSIONS = (4, 8)
ORDERED_METHODS = ("wait_then_fallback", "memcpy_async_current_stream", "same_stream_tensor_copy")
CHUNK = 256
_COLD_S = {8192: 0.9, 32768: 3.6, 131072: 17.5, 262144: 44.0}
_CROSS_ON_S = {8192: 0.16, 32768: 0.28, 131072: 0.605, 262144: 0.79}


@dataclass(frozen=True)
class Flaws:
    """Switches that plant one flaw each; all off gives a clean, publishable ledger."""

    run_incomplete: bool = False
    namespace_leak: bool = False
    unpaired: bool = False
    payload_mismatch: bool = False
    gpu_mismatch: bool = False
    warmup_in_measurement: bool = False
    assertion_failed: bool = False
    assertion_inconsistent: bool = False  # an exact-value check recorded passed on wrong values
    hits_inconsistent: bool = False  # an ON cross step's hits.observed cut to a third of its scrapes'
    off_external_hits: bool = False
    missing_full_prefix: bool = False
    counter_mismatch: bool = False
    checkpoint_mismatch: bool = False
    checkpoint_unverified: bool = False  # no manifest, not a hub snapshot: nothing to check against
    provenance_missing: bool = False
    validation_missing: bool = False
    order_unbalanced: bool = False
    declared_exclusion: bool = False
    probes_failing: bool = False
    helper_failing: bool = False  # the ON config runs LMCache's lazy allocator, whose helper path fails
    pinned_rounding: bool = False  # LMCache's pool reserves a power of two and no setting fixes it
    block_failed: bool = False  # an ON block whose replica died half-way (status failed, partial data)
    not_restarted: bool = False  # attach mode: blocks share one deployment's caches and counters
    hash_seed_unset: bool = False  # an ON replica launched without the others' PYTHONHASHSEED
    ttft_method_mixed: bool = False  # one measured micro response dated in user space, the rest by the kernel
    isolation_missing: bool = False  # the ON config measured without an isolation certificate


@dataclass(frozen=True)
class Shape:
    """How big a screening run is; the defaults are the seed's screening."""

    pairs: int = 2  # block pairs, in ABBA order (OFF–ON–ON–OFF–OFF–ON...)
    chains: int = 2  # micro chains per size per block pair
    sessions: int = 2  # sessions per size × placement per block pair
    turns: int = 6
    window_turns: int = 4
    warmups: int = 6
    sizes: tuple[int, ...] = SIZES
    target: str = "sim"  # sim | vllm
    transfer_path: str = "sim"  # sim | cpu | gpu


@dataclass
class _Ids:
    """Deterministic UUID-shaped ids and increasing RFC 3339 timestamps."""

    seed: int
    n: int = 0
    t_us: int = 0

    def new(self) -> str:
        self.n += 1
        h = hashlib.blake2b(f"{self.seed}:{self.n}".encode(), digest_size=16).hexdigest()
        return f"{h[:8]}-{h[8:12]}-7{h[13:16]}-8{h[17:20]}-{h[20:32]}"

    def ts(self) -> str:
        self.t_us += 1000
        sec, us = divmod(self.t_us, 1_000_000)
        day, sec = divmod(sec, 86400)
        hh, rem = divmod(sec, 3600)
        mm, ss = divmod(rem, 60)
        return f"2026-09-{12 + day:02d}T{hh:02d}:{mm:02d}:{ss:02d}.{us:06d}Z"


LMCACHE_VERSION = "0.5.3"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def config_digest(arm: str, shape: Shape, faulty: bool = False) -> str:
    """The deployment config digest of an arm (the same across runs, as the conventions say)."""
    return sha(f"config|{arm}|{shape.target}|{shape.transfer_path}|{faulty}")


@dataclass
class Generator:
    """Builds envelopes; one instance may emit several runs sharing the id counter."""

    seed: int = 314159
    shape: Shape = field(default_factory=Shape)
    flaws: Flaws = field(default_factory=Flaws)

    def __post_init__(self) -> None:
        self.ids = _Ids(self.seed)
        self.rng = random.Random(self.seed)
        self.out: list[Envelope] = []
        self.planted: dict[str, Any] = {}
        self.fixtures: dict[tuple[str, str], dict[str, int]] = {}

    def fixture(self, run_id: str, label: str) -> dict[str, int]:
        """The expected values of fixture ``label`` (its ``fixture.created``, once per run)."""
        if (run_id, label) not in self.fixtures:
            expected = {"value_000": int(sha(f"needle|{label}")[:5], 16)}
            self.fixtures[(run_id, label)] = expected
            self.emit(
                "fixture.created",
                {
                    "fixture_id": label,
                    "namespace": f"ns-{label}",
                    "nominal_tokens": 0,
                    "payload_sha256": sha(label),
                    "expected": expected,
                },
                run_id,
            )
        return self.fixtures[(run_id, label)]

    # -- envelopes ------------------------------------------------------------

    def emit(self, kind: str, data: dict[str, Any], run_id: str | None, block_id: str | None = None) -> None:
        self.out.append(
            {
                "id": self.ids.new(),
                "ts": self.ids.ts(),
                "kind": kind,
                "run_id": run_id,
                "block_id": block_id,
                "data": data,
            }
        )

    def _plant(self, name: str, value: Any) -> bool:
        """Record where a flaw went; only the first opportunity takes it."""
        if name in self.planted or not getattr(self.flaws, name):
            return False
        self.planted[name] = value
        return True

    # -- runs -----------------------------------------------------------------

    def run_started(self, experiment: str, params: dict[str, Any]) -> str:
        run_id = self.ids.new()
        code: dict[str, Any] = {"commit": sha(f"code{self.seed}")[:40], "dirty": False}
        if experiment == "screening" and self._plant("provenance_missing", run_id):
            code = {"commit": None, "dirty": None}
        self.emit(
            "run.started",
            {
                "experiment": experiment,
                "script_sha256": sha(experiment),
                "seed": self.seed,
                "params": {"target": self.shape.target, **params},
                "code": code,
                "packages": {"kvledger": "0.1.0", "vllm": "0.33.0"},
                "host": {"name": "synthetic"},
                "registers_plan": True,
            },
            run_id,
        )
        return run_id

    def run_finished(self, run_id: str, status: str = "completed") -> None:
        self.emit(
            "run.finished", {"status": status, "error": None if status == "completed" else status}, run_id
        )

    def launch(self, run_id: str, block_id: str | None, arm: str, gpu_swap: bool = False) -> None:
        for replica in (0, 1):
            gpu = replica ^ int(gpu_swap)
            seed: int | None = 0
            digest = config_digest(arm, self.shape)
            if arm == "ON" and replica == 1 and self._plant("hash_seed_unset", digest):
                seed = None
            self.emit(
                "deployment.launched",
                {
                    "replica": replica,
                    "gpu": self.gpu(gpu),
                    "endpoint": f"http://127.0.0.1:{8000 + replica}",
                    "engine": "vllm",
                    "engine_version": "0.33.0",
                    "command": ["vllm", "serve"],
                    "env": {},
                    "model": {"path": "/models/m", "served_name": "m", "revision": "6de592a7"},
                    "config_sha256": config_digest(arm, self.shape),
                    "kv_connector": "lmcache" if arm == "ON" else None,
                    "target": self.shape.target,
                    "transfer_path": self.shape.transfer_path,
                    "arm": arm,
                    "hash_seed": seed,
                    **self.lmcache_fields(arm),
                },
                run_id,
                block_id,
            )
        if arm == "ON":
            self.emit(
                "service.launched",
                {
                    "service": "lmcache",
                    "endpoint": "http://127.0.0.1:8100",
                    "command": None,
                    "env": {},
                    "version": "0.4",
                    "pool_bytes": 1 << 38,
                    "pinned": True,
                },
                run_id,
                block_id,
            )

    def checkpoint(self, run_id: str) -> None:
        good = sha("weights")
        observed = sha("tampered") if self._plant("checkpoint_mismatch", run_id) else good
        unverified = self._plant("checkpoint_unverified", run_id)
        self.emit(
            "checkpoint.audited",
            {
                "path": "/models/m",
                "revision": "6de592a7",
                "matched": None if unverified else observed == good,
                "stable": True,
                "reference": None if unverified else "hf-cache-snapshot",
                "files": [
                    {
                        "name": "model.safetensors",
                        "bytes": 23285140684,
                        "sha256": observed,
                        "expected_sha256": None if unverified else good,
                    },
                    {
                        "name": "config.json",
                        "bytes": 1102,
                        "sha256": sha("config"),
                        "expected_sha256": None,
                        "git_sha1": sha("config")[:40],
                        "expected_git_sha1": None if unverified else sha("config")[:40],
                    },
                ],
                "missing": [],
            },
            run_id,
        )

    def gpu(self, index: int) -> dict[str, Any]:
        uuid = f"GPU-{index:08d}" if self.shape.target == "vllm" else None
        return {"index": index, "uuid": uuid, "name": "H200" if uuid else None}

    # -- the ledger -------------------------------------------------------------

    def ledger(self, screenings: int = 1) -> list[Envelope]:
        """Validation (unless planted missing), probes for GPU paths, then screening runs."""
        if self.shape.transfer_path == "gpu":
            self.probes()
        if not self.flaws.validation_missing:
            self.validation()
        for _ in range(screenings):
            Screening(self).run()
        return _with_plans(self.out)

    def validation(self) -> str:
        config = config_digest("ON", self.shape)
        run_id = self.run_started("validation", {"config_sha256": config})
        self.launch(run_id, None, "ON")
        for i in range(8):
            rid = self.ids.new()
            expected = self.fixture(run_id, f"v{i}")
            self.emit(
                "request.sent",
                _request(rid, i % 2, self.gpu(i % 2), "validation", "cold", f"v{i}", sha(f"val{i}"), 8192),
                run_id,
            )
            self.emit("response.received", _response(rid, 0.5, 8192, 64), run_id)
            self.emit(
                "assertion.evaluated",
                _assertion(rid, "exact_values", True, True, config, expected, expected),
                run_id,
            )
        self.run_finished(run_id)
        return run_id

    def lmcache_fields(self, arm: str) -> dict[str, Any]:
        """The LMCache an ON launch on the GPU path names (what GPU probes are matched by)."""
        if arm != "ON" or self.shape.transfer_path != "gpu":
            return {}
        allocator = "lazy" if self.flaws.helper_failing else "mixed"
        if allocator == "lazy":
            self._plant("helper_failing", config_digest("ON", self.shape))
        return {"lmcache_version": LMCACHE_VERSION, "lmcache_allocator": allocator, "lmcache_ops": False}

    def helper_probes(self) -> None:
        """LMCache's helpers as the seed found them without compiled ops: lazy fails when delayed."""
        run_id = self.run_started("probe.lmcache-helpers", {"sizes": [1 << 20]})
        for allocator, copy in (
            ("lazy", "torch_ops.lmcache_memcpy_async (cudaMemcpy, no stream)"),
            ("mixed", "Tensor.copy_(non_blocking=True) (current stream)"),
        ):
            for direction in ("d2h", "h2d"):
                for delay in (0, 10**8):
                    for trial in range(5):
                        bad = allocator == "lazy" and delay > 0
                        self.emit(
                            "probe.helper",
                            {
                                "allocator": allocator,
                                "helper": f"gpu_ops.lmcache_memcpy_async_{direction}",
                                "copy": copy,
                                "ops_requested": "masked",
                                "with_ops": False,
                                "direction": direction,
                                "bytes": 1 << 20,
                                "delay_cycles": delay,
                                "trial": trial,
                                "passed": not bad,
                                "mismatching_bytes": (1 << 20) if bad else 0,
                                "first_bad_offset": 0 if bad else None,
                                "error": None,
                                "transfer_path": "gpu",
                                "lmcache_version": LMCACHE_VERSION,
                                "lmcache_source_sha256": sha("lmcache"),
                                "torch_version": "2.11.0",
                                "cuda_runtime_version": "13.0",
                                "gpu": self.gpu(2),
                            },
                            run_id,
                        )
        self.run_finished(run_id)

    def pool_probes(self) -> None:
        """LMCache's pool without compiled ops: rounded unmitigated, within tolerance under a setting."""
        run_id = self.run_started("probe.lmcache-pool", {"sizes": [(1 << 30) + 4096]})
        rounding = self._plant("pinned_rounding", run_id)
        requested = (1 << 30) + 4096
        for conf, reserved in (
            (None, 1 << 31),
            (
                "PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True",
                (1 << 31) if rounding else requested + 4096,
            ),
        ):
            self.emit(
                "probe.pinned",
                {
                    "setting": {"LMCACHE_MAX_LOCAL_CPU_SIZE": "1.0000038146972656"},
                    "bytes_requested": requested,
                    "bytes_reserved": reserved,
                    "is_pinned": True,
                    "seconds": 0.8,
                    "alloc_conf": conf,
                    "ops_requested": "masked",
                    "with_ops": False,
                    "error": None,
                    "failed_at": None,
                    "transfer_path": "gpu",
                    "lmcache_version": LMCACHE_VERSION,
                },
                run_id,
            )
        self.run_finished(run_id)

    def probes(self) -> None:
        self.helper_probes()
        self.pool_probes()
        run_id = self.run_started("probe.copy-ordering", {"sizes": [4096, 1 << 20]})
        fail = self.flaws.probes_failing
        for method in ("raw_fallback", *ORDERED_METHODS):
            for direction in ("d2h", "h2d"):
                for delay in (0, 10**8):
                    passed = not (delay and (method == "raw_fallback" or fail))
                    self.emit(
                        "probe.copy",
                        {
                            "method": method,
                            "direction": direction,
                            "bytes": 1 << 20,
                            "delay_cycles": delay,
                            "trial": 0,
                            "mismatching_bytes": 0 if passed else 1 << 20,
                            "passed": passed,
                            "gpu": self.gpu(2),
                        },
                        run_id,
                    )
        self.run_finished(run_id)
        run_id = self.run_started("probe.pinned-alloc", {"sizes": [1 << 38]})
        # The seed's torch: rounded unmitigated, the threshold keeps the request (Section 3.3).
        for conf, pinned in ((None, not fail), ("pinned_max_round_threshold_mb:128", not fail)):
            self.emit(
                "probe.pinned_alloc",
                {
                    "bytes_requested": (1 << 38) + 4096,
                    "bytes_reserved": 1 << 39 if conf is None else (1 << 38) + 4096,
                    "is_pinned": pinned,
                    "seconds": 38.973,
                    "alloc_conf": conf,
                    "rounded_up": conf is None,
                },
                run_id,
            )
        self.run_finished(run_id)


def _request(
    rid: str,
    replica: int,
    gpu: Any,
    workload: str,
    step: str,
    label: str,
    payload: str,
    nominal: int,
    **extra: Any,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "request_id": rid,
        "replica": replica,
        "gpu": gpu,
        "workload": workload,
        "step": step,
        "chain": None,
        "session": None,
        "window": None,
        "turn": None,
        "placement": None,
        "warmup": False,
        "payload_sha256": payload,
        "namespace": f"ns-{label}",
        "nominal_tokens": nominal,
        "params": {"max_tokens": 64, "temperature": 0, "seed": 314159},
        "fixture_id": label,
        "prompt_tokens_expected": nominal,
    }
    data.update(extra)
    return data


def _response(
    rid: str, ttft: float, prompt: int, out: int, decode: float = 60.0, cached: int = 0
) -> dict[str, Any]:
    t_last = ttft + (out - 1) / decode
    return {
        "request_id": rid,
        "status": 200,
        "ttft_s": ttft,
        "t_first": ttft,
        "t_last": round(t_last, 6),
        "e2e_s": round(t_last + 0.001, 6),
        "prompt_tokens": prompt,
        "output_tokens": out,
        "cached_tokens": cached,
        "decode_rate": decode,
        "text_sha256": sha(rid),
        "finish_reason": "stop",
        "error": None,
        "output_text_prefix": "{}",
        "ttft_method": "kernel-stamp",
    }


def _assertion(
    rid: str,
    check: str,
    passed: bool,
    independent: bool,
    config: str,
    expected: Any = None,
    observed: Any = None,
) -> dict[str, Any]:
    return {
        "request_id": rid,
        "check": check,
        "expected": expected,
        "observed": observed,
        "passed": passed,
        "independent": independent,
        "config_sha256": config,
    }


_COUNTER_KEYS = {
    "prefix_queries": 'vllm:prefix_cache_queries_total{engine="0"}',
    "local_hit_tokens": 'vllm:prefix_cache_hits_total{engine="0"}',
    "external_hit_tokens": 'vllm:external_prefix_cache_hits_total{engine="0"}',
}


class _Counters:
    """Each replica's cumulative hit counters, as its /metrics would show them."""

    def __init__(self) -> None:
        self.values: dict[int, dict[str, float]] = {}

    def samples(self, replica: int) -> dict[str, float]:
        return dict(self.values.setdefault(replica, {key: 0.0 for key in _COUNTER_KEYS.values()}))

    def advance(self, replica: int, **deltas: int) -> None:
        current = self.values.setdefault(replica, {key: 0.0 for key in _COUNTER_KEYS.values()})
        for name, delta in deltas.items():
            current[_COUNTER_KEYS[name]] += delta


@dataclass
class _Req:
    """One planned request of a block: its identity and its simulated outcome."""

    workload: str
    step: str
    replica: int
    nominal: int
    label: str
    ttft: float
    local: int = 0
    external: int = 0
    out: int = 64
    extra: dict[str, Any] = field(default_factory=dict)
    independent: bool = True
    warmup: bool = False


class Screening:
    """One screening run: four blocks OFF–ON–ON–OFF in two block pairs."""

    def __init__(self, gen: Generator) -> None:
        self.g = gen
        self.shape = gen.shape
        self.rng = gen.rng
        self.payload_seed = gen.ids.new()

    def run(self) -> str:
        g = self.g
        halves = [("OFF", "ON") if p % 2 == 0 else ("ON", "OFF") for p in range(self.shape.pairs)]
        abba = [arm for half in halves for arm in half]
        order = ["OFF", "ON"] * self.shape.pairs if g.flaws.order_unbalanced else abba
        self.run_id = g.run_started("screening", {"order": order, "sizes": list(self.shape.sizes)})
        if self.shape.target == "vllm":
            g.checkpoint(self.run_id)
        self.failed_blocks: list[str] = []
        self.certified = False
        for index, arm in enumerate(order):
            self.block(index, arm, order)
        if g._plant("run_incomplete", self.run_id):
            return self.run_id
        g.run_finished(self.run_id, "failed" if self.failed_blocks else "completed")
        return self.run_id

    def certificate(self, block_id: str) -> None:
        """The runner's isolation certificate of the ON config, before it is measured: its probes
        (a prime and a repeat under salt A on replica 0, one under salt B on each replica, each a
        single-request window as the runner records it), then the certificate naming them."""
        if self.g._plant("isolation_missing", self.config):
            return

        def probe(step: str, replica: int, local: int = 0) -> str:
            req = _Req(
                "isolation", step, replica, 8192, "isolation", 0.5, local=local, extra={"probe": "isolation"}
            )
            return self.single(req)

        prime = probe("isolation-prime", 0)
        repeat = probe("isolation-repeat", 0, local=8176)
        others = [probe("isolation-other-salt", replica) for replica in (0, 1)]
        zero = {"local_hit_tokens": 0, "external_hit_tokens": 0, "cached_tokens": 0}
        self.g.emit(
            "isolation.certified",
            {
                "config_sha256": self.config,
                "passed": True,
                "problems": [],
                "prime_request_id": prime,
                "repeat_request_id": repeat,
                "repeat": {
                    **zero,
                    "local_hit_tokens": 8176,
                    "cached_tokens": 8176,
                    "lmcache_hit_tokens": None,
                },
                "repeat_hit_tokens": 8176,
                "other_salt": [
                    {"replica": replica, "request_id": rid, **zero, "lmcache_hit_tokens": None}
                    for replica, rid in enumerate(others)
                ],
                "other_salt_hit_tokens": 0,
            },
            self.run_id,
            block_id,
        )

    def block(self, index: int, arm: str, order: list[str]) -> None:
        g, pair = self.g, index // 2
        block_id = g.ids.new()
        swap = pair % 2 == 1
        g.emit(
            "block.started",
            {
                "index": index,
                "arm": arm,
                "pair": pair,
                "status": "started",
                "order": order,
                "gpu_swap": swap,
                "config_sha256": config_digest(arm, self.shape),
                "restarted": not g._plant("not_restarted", block_id),
            },
            self.run_id,
            block_id,
        )
        g.launch(self.run_id, block_id, arm, swap)
        self.block_id, self.arm, self.pair, self.swap = block_id, arm, pair, swap
        self.counters = _Counters()  # every block starts on fresh replicas
        self.config = config_digest(arm, self.shape)
        self.warmup_ids = [
            self.single(_Req("micro", "cold", i % 2, 8192, f"warm{i}", 0.9, warmup=True))
            for i in range(self.shape.warmups)
        ]
        if arm == "ON" and not self.certified:
            self.certified = True
            self.certificate(block_id)
        for req in self.micro():
            self.single(req)
        self.sessions()
        status, error = "completed", None
        if arm == "ON" and index == 1 and g._plant("block_failed", block_id):
            # The replica died after the sessions: no generation or windows, and no declared
            # exclusion (an imported ledger need not carry one); the report must exclude it itself.
            status, error = "failed", "BlockFailed: replica 1 unhealthy (connection refused)"
            self.failed_blocks.append(block_id)
        else:
            for req in self.generation():
                self.single(req)
            self.windows()
        if arm == "OFF" and index == 3 and g._plant("declared_exclusion", block_id):
            g.emit(
                "exclusion.declared",
                {"scope": "block", "target": block_id, "reason": "host maintenance during block"},
                self.run_id,
                block_id,
            )
        g.emit(
            "block.finished",
            {"index": index, "arm": arm, "pair": pair, "status": status, "error": error},
            self.run_id,
            block_id,
        )

    # -- plans ----------------------------------------------------------------

    def noise(self) -> float:
        return 1.0 + self.rng.uniform(-0.03, 0.03)

    def micro(self) -> Iterator[_Req]:
        on = self.arm == "ON"
        for size in self.shape.sizes:
            share = size // CHUNK * CHUNK
            for c in range(self.shape.chains):
                chain = self.pair * self.shape.chains + c
                a, b = c % 2, 1 - c % 2
                label = f"micro-{size}-{chain}"
                cold = _COLD_S[size] * self.noise()
                cross = (_CROSS_ON_S[size] if on else _COLD_S[size]) * self.noise()
                local = 0.05 + size / 2e6 * self.noise()
                common = {"chain": chain}
                yield _Req("micro", "cold", a, size, label, cold, extra=common)
                yield _Req("micro", "local1", a, size, label, local, local=share, extra=common)
                yield _Req("micro", "local2", a, size, label, local, local=share, extra=common)
                yield _Req("micro", "cross", b, size, label, cross, external=share if on else 0, extra=common)
                yield _Req("micro", "receiver_local", b, size, label, local, local=share, extra=common)

    def sessions(self) -> None:
        for size in SESSION_SIZES:
            for placement in PLACEMENTS:
                for s in range(self.shape.sessions):
                    session = f"s-{size}-{placement}-{self.pair}-{s}"
                    reqs = list(self.session_turns(size, placement, session))
                    rids = [self.single(r) for r in reqs]
                    if self.warmup_ids and self.g._plant("warmup_in_measurement", self.warmup_ids[0]):
                        rids.append(self.warmup_ids[0])
                    wall = sum(r.ttft + 1.1 for r in reqs)
                    self.g.emit(
                        "session.finished",
                        {
                            "session": session,
                            "placement": placement,
                            "turns": len(reqs),
                            "wall_s": round(wall, 6),
                            "nominal_tokens": size,
                            "replicas": sorted({r.replica for r in reqs}),
                            "requests": rids,
                        },
                        self.run_id,
                        self.block_id,
                    )

    def session_turns(self, size: int, placement: str, session: str) -> Iterator[_Req]:
        on = self.arm == "ON"
        for turn in range(self.shape.turns):
            replica = turn % 2 if placement == "alternating" else 0
            moved = placement == "alternating" and turn > 0
            prompt = size + 1055 * turn
            if turn == 0:
                ttft = _COLD_S[size]
            elif moved and not on:
                ttft = _COLD_S[size] * 1.02
            else:
                ttft = 0.3 + prompt / 4e6
            yield _Req(
                "session",
                "turn",
                replica,
                size,
                session,
                ttft * self.noise(),
                local=0 if (turn == 0 or moved) else size,
                external=size if (moved and on) else 0,
                extra={"session": session, "turn": turn, "placement": placement},
                independent=turn == 0,
            )

    def generation(self) -> Iterator[_Req]:
        for nominal, step, max_tokens in GEN_CELLS:
            label = f"gen-{nominal}-{step}-{max_tokens}-{self.pair}"
            yield _Req(
                "generation",
                step,
                self.pair % 2,
                nominal,
                label,
                0.5 * self.noise(),
                local=nominal if step == "hot" else 0,
                out=max_tokens,
                extra={"params": {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}},
            )

    # -- emitting ---------------------------------------------------------------

    def payload(self, req: _Req) -> str:
        key = (
            f"{self.payload_seed}|{req.workload}|{req.label}|{req.step}|{req.extra.get('turn')}|{req.warmup}"
        )
        return sha(key)

    def single(self, req: _Req) -> str:
        """A single-request window: scrapes around it, hits, response and assertions."""
        g, rid = self.g, self.g.ids.new()
        if (
            not req.warmup
            and self.arm == "OFF"
            and req.step == "receiver_local"
            and g._plant("unpaired", rid)
        ):
            return rid  # the OFF partner was never sent
        meta = self.meta(req, rid)
        prompt = meta["prompt_tokens_expected"]
        local, external, queries = self.hit_deltas(req, rid, prompt)
        self.scrape(req.replica, "before", request_id=rid)
        g.emit("request.sent", meta, self.run_id, self.block_id)
        decode = 60.0 * self.noise()
        response = _response(
            rid, round(req.ttft, 6), prompt, req.out, round(decode, 4), cached=local + external
        )
        if not req.warmup and req.workload == "micro" and g._plant("ttft_method_mixed", self.run_id):
            response["ttft_method"] = "httpx-read"
        g.emit("response.received", response, self.run_id, self.block_id)
        self.counters.advance(
            req.replica, prefix_queries=queries, local_hit_tokens=local, external_hit_tokens=external
        )
        self.scrape(req.replica, "after", request_id=rid)
        if external and self.arm == "ON" and req.step == "cross" and g._plant("hits_inconsistent", rid):
            external //= 3  # recorded hits no longer what the counters say; the verdict left as it was
            self.hits(req, rid, prompt, local, external, queries)
            self.last_hits = (local, external * 3)
        else:
            self.hits(req, rid, prompt, local, external, queries)
        if not req.warmup and "probe" not in req.extra:
            self.assertions(req, rid, prompt)
        return rid

    def scrape(
        self, replica: int, phase: str, request_id: str | None = None, window: str | None = None
    ) -> None:
        self.g.emit(
            "metrics.scraped",
            {
                "replica": replica,
                "endpoint": "e",
                "samples": self.counters.samples(replica),
                "phase": phase,
                "request_id": request_id,
                "window": window,
                "error": None,
            },
            self.run_id,
            self.block_id,
        )

    def meta(self, req: _Req, rid: str) -> dict[str, Any]:
        gpu = self.g.gpu(req.replica ^ int(self.swap))
        payload = self.payload(req)
        measured = not req.warmup
        if measured and self.arm == "OFF" and req.step == "local2":
            if self.g._plant("payload_mismatch", rid):
                payload = sha(payload)
            elif self.g._plant("gpu_mismatch", rid):
                gpu = self.g.gpu(7)
        data = _request(
            rid, req.replica, gpu, req.workload, req.step, req.label, payload, req.nominal, warmup=req.warmup
        )
        data.update({k: v for k, v in req.extra.items() if k != "params"})
        if "params" in req.extra:
            data["params"] = req.extra["params"]
        data["prompt_tokens_expected"] = req.nominal + 1055 * int(req.extra.get("turn") or 0)
        return data

    def hit_deltas(self, req: _Req, rid: str, prompt: int) -> tuple[int, int, int]:
        """(local, external, prefix queries) of a single-request window, flaws planted."""
        local, external, queries = req.local, req.external, prompt
        measured = not req.warmup
        if (
            measured
            and req.step == "cold"
            and req.workload == "micro"
            and req.nominal == 131072
            and self.g._plant("namespace_leak", self.block_id)
        ):
            local = 10976
        if measured and self.arm == "OFF" and req.step == "cross" and self.g._plant("off_external_hits", rid):
            external = 4096
        if (
            measured
            and self.arm == "ON"
            and req.step == "cross"
            and self.g._plant("missing_full_prefix", rid)
        ):
            external = 0
        if measured and req.step == "local1" and self.g._plant("counter_mismatch", rid):
            queries = 0
        return local, external, queries

    def hits(self, req: _Req, rid: str, prompt: int, local: int, external: int, queries: int) -> None:
        self.g.emit(
            "hits.observed",
            {
                "request_id": rid,
                "window": None,
                "replica": req.replica,
                "prefix_queries": queries,
                "local_hit_tokens": local,
                "external_hit_tokens": external,
                "external_queries": queries,
                "prompt_tokens": prompt,
            },
            self.run_id,
            self.block_id,
        )
        self.last_hits = (local, external)

    def assertions(self, req: _Req, rid: str, prompt: int) -> None:
        emit = self.g.emit

        def check(
            name: str,
            passed: bool,
            independent: bool = True,
            expected: Any = None,
            observed: Any = None,
            **extra: Any,
        ) -> None:
            emit(
                "assertion.evaluated",
                {**_assertion(rid, name, passed, independent, self.config, expected, observed), **extra},
                self.run_id,
                self.block_id,
            )

        local, external = self.last_hits
        if req.workload == "generation":
            check("output_length", True, expected=req.out, observed=req.out)
        else:
            expected = self.g.fixture(self.run_id, req.label)
            ok = not self.g._plant("assertion_failed", rid)
            observed = expected if ok else {k: v + 1 for k, v in expected.items()}
            if ok and self.g._plant("assertion_inconsistent", rid):
                observed = {k: v + 1 for k, v in expected.items()}  # recorded passed all the same
            check("exact_values", ok, req.independent, expected, observed)
        if req.step == "cold":
            check("zero_hits", local == 0 and external == 0, expected=0, observed=local + external)
        if req.step == "cross" and self.arm == "ON":
            share = (prompt - 1) // CHUNK * CHUNK
            check(
                "full_prefix_hit",
                local + external >= share and external > 0,
                expected=share,
                observed=external,
                local_hit_tokens=local,
                prompt_tokens=prompt,
                chunk_size=CHUNK,
            )

    def windows(self) -> None:
        for sessions in WINDOW_SESSIONS:
            for placement in PLACEMENTS:
                self.window(sessions, placement)

    def window(self, sessions: int, placement: str) -> None:
        g = self.g
        window = f"w-{sessions}-{placement}-{self.pair}"
        rids: list[str] = []
        out_total = 0
        for replica in (0, 1):
            self.scrape(replica, "before", window=window)
        for s in range(sessions):
            session = f"{window}-s{s}"
            for turn in range(self.shape.window_turns):
                replica = (s + turn) % 2 if placement == "alternating" else s % 2
                req = _Req(
                    "concurrency",
                    "turn",
                    replica,
                    32768,
                    session,
                    0.5 * self.noise(),
                    extra={"window": window, "session": session, "turn": turn, "placement": placement},
                    independent=turn == 0,
                )
                rid = g.ids.new()
                g.emit("request.sent", self.meta(req, rid), self.run_id, self.block_id)
                g.emit(
                    "response.received",
                    _response(rid, round(req.ttft, 6), 32768 + 1055 * turn, 64),
                    self.run_id,
                    self.block_id,
                )
                self.last_hits = (0, 0)
                self.assertions(req, rid, 32768 + 1055 * turn)
                rids.append(rid)
                out_total += 64
        speed = 1.85 if (placement == "alternating" and self.arm == "ON") else 1.0
        wall = round(len(rids) * 0.8 / speed * self.noise(), 6)
        for replica in (0, 1):
            self.counters.advance(replica, prefix_queries=1000, local_hit_tokens=500, external_hit_tokens=0)
            self.scrape(replica, "after", window=window)
        for replica in (0, 1):
            g.emit(
                "hits.observed",
                {
                    "request_id": None,
                    "window": window,
                    "replica": replica,
                    "prefix_queries": 1000,
                    "local_hit_tokens": 500,
                    "external_hit_tokens": 0,
                    "external_queries": 0,
                    "prompt_tokens": None,
                },
                self.run_id,
                self.block_id,
            )
        g.emit(
            "window.finished",
            {
                "window": window,
                "placement": placement,
                "sessions": sessions,
                "requests": len(rids),
                "output_tokens": out_total,
                "wall_s": wall,
                "nominal_tokens": 32768,
                "replicas": [0, 1],
            },
            self.run_id,
            self.block_id,
        )


def _with_plans(out: list[Envelope]) -> list[Envelope]:
    """Each run with blocks gets the ``plan.registered`` a runner writes before its first request:
    the recorded order, and per block the most measured requests (by workload and step), warmups
    and the sizes any completed block sent; so a flaw that drops requests also deviates."""
    blocks: dict[str, list[Envelope]] = defaultdict(list)
    finished = {e["block_id"]: e["data"]["status"] for e in out if e["kind"] == "block.finished"}
    counts: dict[str, dict[str, Counter[tuple[str, str]]]] = defaultdict(lambda: defaultdict(Counter))
    warmups: dict[str, Counter[str]] = defaultdict(Counter)
    sizes: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for e in out:
        if e["kind"] == "block.started":
            blocks[e["run_id"]].append(e)
        elif (
            e["kind"] == "request.sent"
            and finished.get(e["block_id"]) == "completed"
            and e["data"].get("probe") is None  # a probe is no part of a plan (reports/_plan.py)
        ):
            d = e["data"]
            if d["warmup"]:
                warmups[e["run_id"]][e["block_id"]] += 1
                workload = "warmup"
            else:
                counts[e["run_id"]][e["block_id"]][(d["workload"], d["step"])] += 1
                workload = d["workload"]
            if d.get("nominal_tokens") is not None:
                sizes[e["run_id"]][workload].add(int(d["nominal_tokens"]))
    result = []
    for e in out:
        result.append(e)
        if e["kind"] != "run.started" or e["run_id"] not in blocks:
            continue
        run_id = e["run_id"]
        requests: dict[str, dict[str, int]] = defaultdict(dict)
        for per_block in counts[run_id].values():
            for (workload, step), n in per_block.items():
                requests[workload][step] = max(requests[workload].get(step, 0), n)
        first = blocks[run_id][0]["data"]
        order = first.get("order") or [b["data"]["arm"] for b in blocks[run_id]]
        plan: dict[str, Any] = {
            "experiment": e["data"]["experiment"],
            "seed": e["data"]["seed"],
            "order": list(order),
            "order_rule": "given",
            "requests_per_block": dict(requests),
            "warmups_per_block": max(warmups[run_id].values(), default=0),
            "sizes": {w: sorted(v) for w, v in sorted(sizes[run_id].items())},
            "thresholds": {"min_block_pairs_for_inference": 6},
        }
        plan["plan_sha256"] = sha(json.dumps(plan, sort_keys=True))
        h = hashlib.blake2b(f"plan:{run_id}".encode(), digest_size=16).hexdigest()
        plan_id = f"{h[:8]}-{h[8:12]}-7{h[13:16]}-8{h[17:20]}-{h[20:32]}"
        result.append({**e, "id": plan_id, "kind": "plan.registered", "data": plan})
    return result


def generate(
    seed: int = 314159, shape: Shape | None = None, flaws: Flaws | None = None, screenings: int = 1
) -> tuple[list[Envelope], dict[str, Any]]:
    """A whole synthetic ledger; returns (bare envelopes in order, where each flaw was planted)."""
    gen = Generator(seed, shape or Shape(), flaws or Flaws())
    events = gen.ledger(screenings)
    return events, dict(gen.planted)

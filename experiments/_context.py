"""What an experiment's ``run(ctx)`` works with: the run context and its blocks.

The experiment decides *what* to send (fixtures, namespaces, placements);
the context and blocks decide *how it is recorded*: every request is a
single-request metric window (scrape, send, scrape, ``hits.observed``) or
part of a concurrent window, every answer is checked, warmups are flagged,
and a replica that stops answering its health check fails the block.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from collectors import (
    DEFAULT_TTFT_METHOD,
    EventSink,
    HitDelta,
    MetricsError,
    Outcome,
    RequestSpec,
    Scraper,
    check_counters_match,
    check_exact_values,
    check_full_prefix_hit,
    check_matches_cold_reference,
    check_no_external_hits_off,
    check_output_length,
    check_stream_complete,
    check_zero_hits,
    scrape_metrics,
    send_request,
)
from ledger import Ledger, NewEvent, canonical_json, new_id, sha256_hex, utc_now

from .fixture_text import served_key
from .fixtures import Fixture, FixtureFactory, Messages, SessionHistory, make_namespace
from .targets._base import Launch, Replica, Target, TargetError

__all__ = [
    "MIN_BLOCK_PAIRS_FOR_INFERENCE",
    "Block",
    "BlockFailed",
    "BlockSpec",
    "Counters",
    "RunContext",
    "SessionPlan",
    "Sink",
    "balanced_order",
    "check_block_design",
]

MIN_BLOCK_PAIRS_FOR_INFERENCE = 6
"""Block pairs a cell needs before the report computes intervals (registered with each plan;
the audit checks the report's rule is the same)."""
_REQUEST_TIMEOUT_S = 600.0
_RESET_PATH = "/reset_prefix_cache"
_KV_USAGE = "vllm:kv_cache_usage_perc"
_CACHE_INFO = "vllm:cache_config_info"
STORED_OBJECT_METRICS = ("sim_lmcache_stored_chunks",)
"""Gauges of a shared service that count its stored objects: the sim's tier exposes one; LMCache's
own services expose no count under a name recorded so far, so their count is recorded as null."""
STORED_BYTES_METRICS = ("lmcache_mp_l1_memory_usage_bytes",)
"""Gauges of a shared service that give the bytes it holds: LMCache's multiprocess service exposes
its L1 (CPU memory) tier's resident bytes (0.5.3 and 0.5.6 alike)."""
_MAX_CONNECTIONS = 64
_PATH = "/v1/chat/completions"


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    """The exception a task group stands for: a failed block first, else the first."""
    leaves = list(group.exceptions)
    failed = [e for e in leaves if isinstance(e, BlockFailed)]
    return failed[0] if failed else leaves[0]


class BlockFailed(Exception):
    """A replica became unhealthy: the block is marked failed, the run goes on."""

    def __init__(self, message: str, replica: int | None = None) -> None:
        super().__init__(message)
        self.replica = replica


class Sink:
    """Buffers events of the run and appends them in atomic batches.

    One ``extend`` per window keeps a 768-request screening to a few
    hundred transactions; each batch lands whole or not at all, so an
    interrupted run never holds a half-written event (a SIGKILL loses at most
    the window in flight, and the run then visibly lacks ``run.finished``).
    """

    def __init__(self, ledger: Ledger, run_id: str, max_buffer: int = 2000) -> None:
        self.ledger = ledger
        self.run_id = run_id
        self.block_id: str | None = None
        self.max_buffer = max_buffer
        self._buffer: list[NewEvent] = []

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        self._buffer.append(NewEvent(kind, data, run_id=self.run_id, block_id=self.block_id, ts=utc_now()))
        if len(self._buffer) >= self.max_buffer:
            self.flush()

    def emit_run(self, kind: str, data: dict[str, Any]) -> None:
        """An event of the run itself (no block), whatever block is open."""
        self._buffer.append(NewEvent(kind, data, run_id=self.run_id, ts=utc_now()))

    def flush(self) -> None:
        batch, self._buffer = self._buffer, []
        if batch:
            self.ledger.extend(batch)  # append_many without building the recorded events


@dataclass
class Counters:
    """What the run did, for ``run.finished`` and the exit status."""

    measured: int = 0
    warmups: int = 0
    assertions: int = 0
    failed_assertions: int = 0
    failed_blocks: list[int] = field(default_factory=list)
    probes: int = 0
    """Requests of the isolation certificate and of divergence triage: recorded, never measured."""

    def count(self, passed: bool) -> None:
        self.assertions += 1
        self.failed_assertions += not passed


@dataclass(frozen=True)
class BlockSpec:
    """One block of the run order: position, arm, pair and GPU assignment."""

    index: int
    arm: str
    pair: int
    gpu_swap: bool
    order: tuple[str, ...]

    def gpus(self, replicas: int) -> list[int]:
        """Replica i's GPU; the swapped pairs reverse the assignment."""
        gpus = list(range(replicas))
        return gpus[::-1] if self.gpu_swap else gpus


def balanced_order(pairs: int) -> list[str]:
    """OFF–ON, ON–OFF, OFF–ON, ...: the seed's OFF–ON–ON–OFF for two pairs."""
    return [arm for p in range(pairs) for arm in (("OFF", "ON") if p % 2 == 0 else ("ON", "OFF"))]


def check_block_design(pairs: Any, order: Sequence[str] | None = None) -> None:
    """Refuse a block design the audit would call unbalanced (ValueError: exit 2, nothing written).

    A block pair is two adjacent blocks, one ON and one OFF. ON and OFF have the same mean
    position (so a drift over the run cannot pass for an arm effect) only when as many pairs
    run ON first as OFF first: the pair count must be even, and a given order must balance.
    """
    if not isinstance(pairs, int) or isinstance(pairs, bool) or pairs < 1:
        raise ValueError(f"block_pairs must be a positive integer, got {pairs!r}")
    if pairs % 2:
        raise ValueError(
            f"block_pairs must be even, got {pairs}: a balanced order mirrors every OFF–ON pair with an "
            "ON–OFF pair (OFF–ON–ON–OFF), so ON and OFF blocks have the same mean position and a drift "
            "over the run cannot pass for an arm effect; with an odd count one pair stays unmirrored"
        )
    if order is None:
        return
    arms = list(order)
    if len(arms) != 2 * pairs or any(
        sorted(arms[i : i + 2]) != ["OFF", "ON"] for i in range(0, len(arms), 2)
    ):
        raise ValueError(f"order must list {pairs} block pairs, each one ON and one OFF, got {arms}")
    on = sum(i for i, arm in enumerate(arms) if arm == "ON")
    if 2 * on != sum(range(len(arms))):
        raise ValueError(
            f"order {'–'.join(arms)} is unbalanced: ON and OFF blocks differ in mean position "
            "(as many pairs must run ON first as OFF first, e.g. OFF–ON–ON–OFF)"
        )


@dataclass(frozen=True)
class SessionPlan:
    """One session of a concurrent window: its history, namespace and replicas per turn."""

    session: str
    history: SessionHistory
    namespace: str
    replicas: tuple[int, ...]
    placement: str
    key: str


def exact_values_limit(
    card_limit: int | None, card: Mapping[str, Any] | None, asked_lines: str
) -> int | None:
    """The largest prompt whose answers an exact-value check holds: the card's limit (None: no
    card, any size) for the seed's question; for every-line and dense questions the limit of the
    card's part for them (fixture_text.CARD_PARTS), 0 where it cites no evaluation that asked them."""
    if card_limit is None or asked_lines == "spot":
        return card_limit
    return int((card or {}).get(served_key(asked_lines)) or 0)


class RunContext:
    """The ``ctx`` an experiment's ``run(ctx)`` receives (see experiments/README.md)."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        sink: Sink,
        target: Target,
        experiment: str,
        params: Mapping[str, Any],
        seed: int,
        counters: Counters,
        progress: Callable[[str, int], None] | None = None,
        planned: Mapping[str, Any] | None = None,
        plan: Mapping[str, Any] | None = None,
        replayed_thresholds: Mapping[str, Any] | None = None,
    ) -> None:
        self.ledger = ledger
        self.sink = sink
        self.target = target
        self.experiment = experiment
        self.params: dict[str, Any] = dict(params)
        self.seed = seed
        self.counters = counters
        self.run_id = sink.run_id
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(_REQUEST_TIMEOUT_S), limits=httpx.Limits(max_connections=_MAX_CONNECTIONS)
        )
        # How TTFT is dated: a run param, so run.started records the choice (each response, what was used).
        self.ttft_method = str(self.params.get("ttft_method") or DEFAULT_TTFT_METHOD)
        # What a fixture's question asks (fixture_text.ASKED_LINES): a run param, so run.started
        # records it, and each fixture.created its own.
        self.asked_lines = str(self.params.get("asked_lines") or "spot")
        self.fixtures = FixtureFactory(self._tokenize, asked_lines=self.asked_lines)
        self._progress = progress or (lambda _what, _n: None)
        self._created: set[tuple[str, str]] = set()
        self._tokenize_url: str | None = None
        self.stop_requested = False
        self.certified: set[str] = set()
        """ON configs whose isolation certificate this run has taken (once per config)."""
        # What the experiment says it will send (its planned() and plan()), registered before
        # the first request: plan.registered.
        self._planned: dict[str, Any] = dict(planned or {})
        self._plan: dict[str, Any] = dict(plan or {})
        self.registered_plan: dict[str, Any] | None = None
        # A replay's checks: the thresholds its original registered (plan.registered), where they
        # came from a file that may have changed since (the model card's limit), so that it
        # registers the same plan and applies the same checks as the run it re-executes.
        self.replayed_thresholds: dict[str, Any] | None = (
            dict(replayed_thresholds) if replayed_thresholds is not None else None
        )

    async def send(self, spec: RequestSpec, sink: EventSink) -> Outcome:
        """One streamed request, its TTFT dated by the run's ``ttft_method``."""
        return await send_request(
            self.client,
            spec,
            sink,
            _REQUEST_TIMEOUT_S,
            method=self.ttft_method,
            max_connections=_MAX_CONNECTIONS,
        )

    # --- what the target says about itself ------------------------------------------

    @property
    def answers_meaningful(self) -> bool:
        """False for a random-weight model: exact values are then not checked (not applicable)."""
        return self.target.answers_meaningful

    @property
    def meaningful_up_to_tokens(self) -> int | None:
        """The largest prompt whose answers mean something (a model card's limit); None: any.
        Every-line questions take the card's every-line limit: 0 (none served) where the card
        cites no evaluation that asked them. A replay takes the limit its original registered."""
        if self.replayed_thresholds is not None and "exact_values_up_to_tokens" in self.replayed_thresholds:
            limit = self.replayed_thresholds["exact_values_up_to_tokens"]
            return None if limit is None else int(limit)
        return self.card_exact_values_limit

    @property
    def card_exact_values_limit(self) -> int | None:
        """The exact-value checks' limit the served model's card gives now."""
        return exact_values_limit(
            self.target.meaningful_up_to_tokens, self.target.model_card, self.asked_lines
        )

    def answers_meaningful_at(self, prompt_tokens: int | None) -> bool:
        """Whether an exact-value check applies to a prompt of this size."""
        limit = self.meaningful_up_to_tokens
        if not self.answers_meaningful:
            return False
        return limit is None or (prompt_tokens is not None and prompt_tokens <= limit)

    @property
    def restarts_blocks(self) -> bool:
        """Whether every block runs on a freshly restarted deployment (attach mode: no)."""
        return self.target.restarts_blocks

    @property
    def warmup_every_replica(self) -> bool:
        """Real engines: every replica gets a warmup before any measured request (even warmups=0).

        A fresh vLLM replica whose first request was a cross-replica hit was seen to
        die on this stack (experiments/targets/vllm/NOTES.md); the sim has no such failure.
        """
        return self.target.warmup_every_replica

    # --- naming and inputs ---------------------------------------------------

    @property
    def tag(self) -> str:
        """The run's namespace root: ``params["namespace_tag"]`` (recorded, so replays reuse it)."""
        return str(self.params["namespace_tag"])

    def namespace(self, *parts: object) -> str:
        """A ``cache_salt`` under this run's tag: ``TAG-part-part...``."""
        return make_namespace(self.tag, *parts)

    def fixture_key(self, *parts: object) -> str:
        """Stream key of a fixture: seed and parts, never the run id (replays match)."""
        return ":".join([str(self.seed), *(str(p) for p in parts)])

    async def _tokenize(self, messages: Messages) -> int:
        if self._tokenize_url is None:
            raise TargetError("fixtures need a started deployment (inside ctx.run_blocks)")
        body = {
            "model": self.target.model_name,
            "messages": messages,
            "add_generation_prompt": True,
            "chat_template_kwargs": self.template_kwargs,
        }
        resp = await self.client.post(self._tokenize_url + "/tokenize", json=body)
        resp.raise_for_status()
        # orjson: the body carries every token id (256k of them at the largest size).
        return int(orjson.loads(resp.content)["count"])

    @property
    def template_kwargs(self) -> dict[str, Any]:
        return {"enable_thinking": bool(self.params.get("thinking", False))}

    async def fixture(self, key: str, nominal: int, namespace: str) -> Fixture:
        """The fixture of stream ``key`` at ``nominal`` tokens; ``fixture.created`` once per run."""
        fx = await self.fixtures.fixture(key, nominal)
        self._record_fixture(fx, namespace)
        return fx

    def _record_fixture(self, fx: Fixture, namespace: str) -> None:
        if (fx.fixture_id, namespace) not in self._created:
            self._created.add((fx.fixture_id, namespace))
            self.sink.emit_run("fixture.created", fx.event_data(namespace))

    async def history(self, fixture: Fixture, turns: int, growth: int) -> SessionHistory:
        """Canonical session history (expected JSON as the previous answers)."""
        return await self.fixtures.session(fixture, turns, growth)

    def body(
        self, messages: Messages, namespace: str, *, max_tokens: int, ignore_eos: bool = False
    ) -> dict[str, Any]:
        """The exact request body: nothing time-dependent or random, so replays match bytes."""
        body: dict[str, Any] = {
            "model": self.target.model_name,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": self.params.get("temperature", 0),
            "seed": self.seed,
            "stream": True,
            "stream_options": {"include_usage": True},
            "cache_salt": namespace,
            "chat_template_kwargs": self.template_kwargs,
        }
        if ignore_eos:
            body["ignore_eos"] = True
        top = int(self.params.get("top_logprobs") or 0)
        if top:  # the response then records the smallest top-1 minus top-2 margin
            body["logprobs"] = True
            body["top_logprobs"] = top
        return body

    # --- blocks ----------------------------------------------------------------

    def block_plan(
        self, pairs: int, order: Sequence[str] | None = None, gpu_swap: bool = True
    ) -> list[BlockSpec]:
        """Blocks for ``pairs`` ON/OFF pairs: balanced order unless given; odd pairs swap GPUs."""
        arms = tuple(order) if order else tuple(balanced_order(pairs))
        return [BlockSpec(i, arm, i // 2, gpu_swap and (i // 2) % 2 == 1, arms) for i, arm in enumerate(arms)]

    def warmup_count(self, count: int) -> int:
        """Warmups a block sends when asked for ``count``: each replica gets one where any are sent,
        and targets that need every replica warm get one each even for 0."""
        if count or self.warmup_every_replica:
            return max(count, self._replica_count())
        return 0

    def register_plan(self, specs: Sequence[BlockSpec]) -> dict[str, Any]:
        """Record ``plan.registered`` (once, before the first request): block order and the rule and
        seed behind it, measured requests per block by workload and step, sizes, the thresholds the
        checks use. A replay registers the same plan, byte for byte (``plan_sha256``)."""
        if self.registered_plan is not None:
            return self.registered_plan
        arms = [s.arm for s in specs]
        requests = self._plan.get("requests")
        if requests is None and "requests_per_block" in self._planned:
            # The experiment gives only a total: the audit can hold it to that alone.
            requests = {"*": {"*": int(self._planned["requests_per_block"])}}
        warmups = self.warmup_count(int(self._planned.get("warmups_per_block", 0)))
        sizes = {str(k): sorted({int(x) for x in v}) for k, v in dict(self._plan.get("sizes", {})).items()}
        if warmups and "warmup_tokens" in self.params:
            sizes["warmup"] = [int(self.params["warmup_tokens"])]
        plan: dict[str, Any] = {
            "experiment": self.experiment,
            "seed": self.seed,
            "order": arms,
            "order_rule": "balanced" if arms == balanced_order(len(arms) // 2) else "given",
            "gpu_swap": [s.gpu_swap for s in specs],
            "replicas": self._replica_count(),
            "requests_per_block": requests or {},
            "warmups_per_block": warmups,
            "sizes": sizes,
            "thresholds": {
                "chunk_size": self.target.chunk_size,
                "min_block_pairs_for_inference": MIN_BLOCK_PAIRS_FOR_INFERENCE,
                "ttft_method": self.ttft_method,
                "max_tokens": int(self.params.get("max_tokens", 64)),
                "answers_meaningful": self.answers_meaningful,
                "exact_values_up_to_tokens": self.meaningful_up_to_tokens,
                # Only when not the seed's question: a replay of a run recorded before the
                # choice existed still registers its plan byte for byte.
                **({"asked_lines": self.asked_lines} if self.asked_lines != "spot" else {}),
            },
        }
        plan["plan_sha256"] = sha256_hex(canonical_json(plan))
        self.sink.emit_run("plan.registered", plan)
        self.sink.flush()
        self.registered_plan = plan
        return plan

    async def run_blocks(self, specs: Sequence[BlockSpec], body: Callable[[Block], Awaitable[None]]) -> None:
        """Run ``body`` in each block, in order, each on a freshly (re)started deployment.

        A block whose replica becomes unhealthy (:class:`BlockFailed`) or whose
        deployment does not start (:class:`TargetError`) is recorded ``failed``
        and the run goes on with the next block (or stops cleanly when
        ``params["stop_on_block_failure"]``). Cancellation (Ctrl-C) marks the
        block ``aborted`` and propagates; any other error marks it ``failed``
        and propagates. The plan is registered before the first block.
        """
        self.register_plan(specs)
        for spec in specs:
            if self.stop_requested:
                break
            await self._one_block(spec, body)

    async def _one_block(self, spec: BlockSpec, body: Callable[[Block], Awaitable[None]]) -> None:
        block_id = new_id()
        self.sink.flush()
        self.sink.block_id = block_id
        gpus = spec.gpus(self._replica_count())
        head = {"index": spec.index, "arm": spec.arm, "pair": spec.pair}
        self.sink.emit(
            "block.started",
            {
                **head,
                "status": "started",
                "order": list(spec.order),
                "gpu_swap": spec.gpu_swap,
                "config_sha256": self.target.config_sha256(spec.arm),
                "gpus": gpus,
                "restarted": self.restarts_blocks,
            },
        )
        status, error, unhealthy = "completed", None, None
        try:
            launch = await self.target.start(arm=spec.arm, gpus=gpus)
            for record in launch.records:
                self.sink.emit(record.kind, record.data)
            self._tokenize_url = launch.replicas[0].endpoint
            await self._inspect_caches(launch)
            self.sink.flush()
            await body(Block(self, spec, block_id, launch))
        except (BlockFailed, TargetError) as exc:
            status, error = "failed", f"{type(exc).__name__}: {exc}"
            unhealthy = exc.replica if isinstance(exc, BlockFailed) else None
            self.counters.failed_blocks.append(spec.index)
            self.stop_requested = bool(self.params.get("stop_on_block_failure", False))
        except (asyncio.CancelledError, KeyboardInterrupt):
            status, error = "aborted", "interrupted"
            raise
        except BaseException as exc:
            status, error = "failed", f"{type(exc).__name__}: {exc}"
            self.counters.failed_blocks.append(spec.index)
            raise
        finally:
            await self._finish_block(head, status, error, block_id, unhealthy)

    async def _finish_block(
        self,
        head: dict[str, Any],
        status: str,
        error: str | None,
        block_id: str,
        unhealthy: int | None = None,
    ) -> None:
        try:
            for record in await asyncio.shield(self.target.stop()):
                self.sink.emit(record.kind, record.data)
        except Exception as exc:  # a stop fault is recorded with the block, never raised
            error = error or f"stop failed: {exc}"
        if status != "completed":
            # Nothing of a failed or aborted block may reach a table: the whole block is
            # excluded (never single requests), and the exclusion says why.
            self.sink.emit(
                "exclusion.declared",
                {
                    "scope": "block",
                    "target": block_id,
                    "reason": f"block {status}: {error}",
                    "source": "runner",
                },
            )
        self.sink.emit(
            "block.finished", {**head, "status": status, "error": error, "unhealthy_replica": unhealthy}
        )
        self.sink.flush()
        self.sink.block_id = None
        self._progress("block", 1)

    async def _inspect_caches(self, launch: Launch) -> None:
        """``cache.inspected``: the block's starting cache state, before its first request. Each
        replica's prefix cache is reset (and whether that succeeded recorded: vLLM serves the
        endpoint only in its dev mode), then its KV usage and device cache read from /metrics."""
        replicas = [await self._inspect_replica(r) for r in launch.replicas]
        # Where the tier serves its own metrics (the URL scraped around every window); a service
        # whose target names none serves none (a tcp:// or lm:// endpoint, an HTTP front end).
        (stored, metric), (held, bytes_metric) = (
            ((None, None), (None, None))
            if launch.tier_metrics is None
            else await self._tier_state(launch.tier_metrics)
        )
        resets = [r["reset_ok"] for r in replicas]
        usage = [r["kv_cache_usage"] for r in replicas if r["kv_cache_usage"] is not None]
        self.sink.emit(
            "cache.inspected",
            {
                "replicas": replicas,
                "reset_ok": all(resets) if resets else None,
                "kv_cache_usage": max(usage) if usage else None,
                "lmcache_stored_objects": stored,
                "lmcache_metric": metric,
                "lmcache_stored_bytes": held,
                "lmcache_bytes_metric": bytes_metric,
                "restarted": self.restarts_blocks,
            },
        )

    async def _inspect_replica(self, replica: Replica) -> dict[str, Any]:
        status, error = None, None
        try:
            resp = await self.client.post(replica.endpoint + _RESET_PATH, timeout=30.0)
            status = resp.status_code
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:200]
        try:
            samples, scrape_error = await scrape_metrics(self.client, replica.endpoint), None
        except MetricsError as exc:
            samples, scrape_error = {}, str(exc)[:200]
        info = _info_labels(samples, _CACHE_INFO)
        blocks, block_size = _int(info.get("num_gpu_blocks")), _int(info.get("block_size"))
        usage = [v for k, v in samples.items() if k == _KV_USAGE or k.startswith(_KV_USAGE + "{")]
        return {
            "replica": replica.index,
            "endpoint": replica.endpoint,
            "reset_status": status,
            "reset_ok": status == 200,
            "reset_error": error,
            "kv_cache_usage": max(usage) if usage else None,
            "num_gpu_blocks": blocks,
            "block_size": block_size,
            "device_cache_tokens": blocks * block_size
            if blocks is not None and block_size is not None
            else None,
            "metric_families": sorted({k.split("{", 1)[0] for k in samples}),
            "scrape_error": scrape_error,
        }

    async def _tier_state(
        self, endpoint: str
    ) -> tuple[tuple[int | None, str | None], tuple[int | None, str | None]]:
        """The shared service's stored-object count and resident bytes, each with the gauge it was
        read from, where it exposes one under a known name (None where not, or unreachable)."""
        try:
            samples = await scrape_metrics(self.client, endpoint)
        except MetricsError:
            return (None, None), (None, None)

        def gauge(names: tuple[str, ...]) -> tuple[int | None, str | None]:
            for name in names:
                values = [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
                if values:
                    return int(sum(values)), name
            return None, None

        return gauge(STORED_OBJECT_METRICS), gauge(STORED_BYTES_METRICS)

    def _replica_count(self) -> int:
        return int(self.params.get("replicas", 2))

    async def aclose(self) -> None:
        await self.client.aclose()


def _info_labels(samples: Mapping[str, float], name: str) -> dict[str, str]:
    """The labels of an info metric's first series: ``name{a="1",b="x"}`` → {"a": "1", "b": "x"}."""
    key = next((k for k in samples if k.startswith(name + "{")), None)
    if key is None:
        return {}
    out = {}
    for part in key[len(name) + 1 : -1].split('",'):
        label, _, value = part.partition("=")
        if label:
            out[label.strip()] = value.strip().strip('"')
    return out


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


@dataclass
class Result:
    """A measured request's outcome and its window's hit deltas."""

    outcome: Outcome
    delta: HitDelta | None
    seconds: float
    """Send to checks done: request handling, parsing and recording, no scrapes."""


@dataclass(frozen=True)
class Sent:
    """What a measured request sent, kept for the block so a divergent answer can be re-sent."""

    messages: Messages
    replica: int
    namespace: str
    max_tokens: int
    ignore_eos: bool
    key: str
    fixture: Fixture | None


@dataclass(frozen=True)
class Probed:
    """A probe's result, with the scrapes around it (None where a scrape failed)."""

    result: Result
    before: dict[str, float] | None
    after: dict[str, float] | None


class Block:
    """One block's deployment, and the ways to send recorded requests to it."""

    def __init__(self, ctx: RunContext, spec: BlockSpec, block_id: str, launch: Launch) -> None:
        self.ctx = ctx
        self.spec = spec
        self.block_id = block_id
        self.launch = launch
        self.sink = ctx.sink
        self.scraper = Scraper(ctx.client, ctx.sink, tier_url=launch.tier_metrics)
        self._sent: dict[str, Sent] = {}
        self._triaged: set[str] = set()

    @property
    def arm(self) -> str:
        return self.spec.arm

    @property
    def index(self) -> int:
        return self.spec.index

    @property
    def replicas(self) -> tuple[Replica, ...]:
        return self.launch.replicas

    @property
    def config_sha256(self) -> str:
        return self.launch.config_sha256

    def replica(self, index: int) -> Replica:
        return self.launch.replicas[index % len(self.launch.replicas)]

    # --- building blocks ---------------------------------------------------------

    def _spec(
        self, replica: Replica, body: dict[str, Any], meta: dict[str, Any], checked: Fixture | None = None
    ) -> RequestSpec:
        full = {
            "replica": replica.index,
            "gpu": replica.gpu,
            "chain": None,
            "session": None,
            "window": None,
            "turn": None,
            "placement": None,
            "warmup": False,
            "nominal_tokens": None,
            "fixture_id": None,
            "prompt_tokens_expected": None,
            "namespace": body["cache_salt"],
            **meta,
        }
        full["request_key"] = f"b{self.index}/{full.get('request_key', '')}"
        spec = RequestSpec(new_id(), replica.endpoint, _PATH, body, full)
        keep = checked.answer_chars if checked is not None else None
        return spec if keep is None else dataclasses.replace(spec, text_chars=keep)

    async def _after(self, outcome: Outcome, replica: Replica, warmup: bool) -> None:
        """Count the request; fail the block if its replica stopped answering health checks."""
        if warmup:
            self.ctx.counters.warmups += 1
        else:
            self.ctx.counters.measured += 1
        self.ctx._progress("request", 1)
        if not outcome.ok and not await self._still_healthy(replica):
            self.sink.flush()
            raise BlockFailed(f"replica {replica.index} unhealthy after {outcome.error}", replica.index)

    async def _still_healthy(self, replica: Replica) -> bool:
        """Health after a failed request; a target may ask for a second look a moment later
        (a dying engine can end the stream before its server reports it)."""
        if not await self.ctx.target.healthy(replica.index):
            return False
        settle = self.ctx.target.health_settle_s
        if settle <= 0:
            return True
        await asyncio.sleep(settle)
        return await self.ctx.target.healthy(replica.index)

    def count_check(self, passed: bool) -> None:
        """Count an assertion the experiment evaluated itself (for the exit status)."""
        self.ctx.counters.count(passed)

    # --- single-request windows -----------------------------------------------------

    async def request(
        self,
        messages: Messages,
        *,
        replica: int,
        namespace: str,
        workload: str,
        step: str,
        key: str,
        max_tokens: int | None = None,
        ignore_eos: bool = False,
        expected: Mapping[str, Any] | None = None,
        independent: bool = True,
        warmup: bool = False,
        fixture: Fixture | None = None,
        prompt_tokens: int | None = None,
        **meta: Any,
    ) -> Result:
        """One request in its own metric window, checked (warmups are recorded, not checked).

        Checks: ``stream_complete``; ``exact_values`` when ``expected``;
        ``output_length`` with ``ignore_eos``; ``zero_hits`` on ``cold`` steps;
        ``full_prefix_hit`` (ON) or ``no_external_hits_off`` (OFF) on ``cross``
        steps; ``counters_match`` for every complete response.
        """
        if not warmup:
            await self.ensure_isolation_certified()
        limit = max_tokens or self._answer_limit(fixture if expected is not None else None)
        rep = self.replica(replica)
        spec = self._request_spec(
            messages,
            rep,
            namespace=namespace,
            limit=limit,
            ignore_eos=ignore_eos,
            workload=workload,
            step=step,
            key=key,
            fixture=fixture,
            prompt_tokens=prompt_tokens,
            meta={"warmup": warmup, **meta},
            checked=expected is not None,
        )
        sending = 0.0  # the request's own seconds: the scrapes around it are not the session's time

        async def send(s: RequestSpec) -> Outcome:
            nonlocal sending
            t0 = time.perf_counter()
            try:
                return await self.ctx.send(s, self.sink)
            finally:
                sending = time.perf_counter() - t0

        outcome, delta = await self.scraper.single(spec, rep.index, send=send)
        t1 = time.perf_counter()
        diverged = False
        if not warmup:
            diverged = self._answer_checks(outcome, expected, independent, prompt_tokens)
            self._checks(outcome, delta, step, limit, ignore_eos)
            self._sent[outcome.request_id] = Sent(
                messages, rep.index, namespace, limit, ignore_eos, key, fixture
            )
        seconds = sending + (time.perf_counter() - t1)
        await self._after(outcome, rep, warmup)
        if diverged:
            await self.triage(outcome, None, "exact_values")
        return Result(outcome, delta, seconds)

    def _default_max_tokens(self) -> int:
        return int(self.ctx.params.get("max_tokens", 64))

    def _answer_limit(self, asked: Fixture | None) -> int:
        """``max_tokens`` of a request whose answer is checked against ``asked``: the run's, or
        more where an every-line answer needs it (a cut-off answer would fail as wrong)."""
        return max(self._default_max_tokens(), (asked.answer_limit or 0) if asked else 0)

    def _request_spec(
        self,
        messages: Messages,
        rep: Replica,
        *,
        namespace: str,
        limit: int,
        ignore_eos: bool,
        workload: str,
        step: str,
        key: str,
        fixture: Fixture | None,
        prompt_tokens: int | None,
        meta: Mapping[str, Any],
        checked: bool = False,
    ) -> RequestSpec:
        """The request's body and its ``request.sent`` fields: one builder for every path.
        ``checked``: the answer is checked against ``fixture`` (its text kept as that needs)."""
        body = self.ctx.body(messages, namespace, max_tokens=limit, ignore_eos=ignore_eos)
        return self._spec(
            rep,
            body,
            {
                "workload": workload,
                "step": step,
                "request_key": key,
                "nominal_tokens": fixture.nominal_tokens if fixture else None,
                "fixture_id": fixture.fixture_id if fixture else None,
                "prompt_tokens_expected": prompt_tokens,
                **meta,
            },
            fixture if checked else None,
        )

    def _answer_checks(
        self,
        outcome: Outcome,
        expected: Mapping[str, Any] | None,
        independent: bool,
        prompt_tokens: int | None,
    ) -> bool:
        """What the answer itself shows: a complete stream, and the planted values where they apply.
        Returns whether a complete answer failed its exact values (a divergence to triage)."""
        sink, cfg = self.sink, self.config_sha256
        self.count_check(check_stream_complete(sink, outcome, config_sha256=cfg))
        # Beyond what the served model answers meaningfully, exact values are not applicable.
        if expected is not None and self.ctx.answers_meaningful_at(prompt_tokens):
            exact = check_exact_values(sink, outcome, expected, independent=independent, config_sha256=cfg)
            self.count_check(exact)
            return not exact and outcome.ok
        return False

    def _checks(self, outcome: Outcome, delta: HitDelta, step: str, limit: int, ignore_eos: bool) -> None:
        """What the request's own counter window shows (a single-request window only)."""
        sink, cfg, rid = self.sink, self.config_sha256, outcome.request_id
        if ignore_eos:
            self.count_check(check_output_length(sink, outcome, limit, config_sha256=cfg))
        if step == "cold":
            self.count_check(
                check_zero_hits(sink, rid, delta, cached_tokens=outcome.cached_tokens, config_sha256=cfg)
            )
        if step == "cross" and self.arm == "ON":
            self.count_check(
                check_full_prefix_hit(
                    sink, rid, delta, outcome.prompt_tokens, self.ctx.target.chunk_size, config_sha256=cfg
                )
            )
        if step == "cross" and self.arm == "OFF":
            self.count_check(check_no_external_hits_off(sink, delta, request_id=rid, config_sha256=cfg))
        if outcome.ok:
            self.count_check(
                check_counters_match(
                    sink, rid, delta, outcome.prompt_tokens, outcome.cached_tokens, config_sha256=cfg
                )
            )

    async def check_cold_reference(self, result: Result, cold: Result) -> bool:
        """``matches_cold_reference`` of a reused answer against the same payload computed cold;
        a complete answer that differs is triaged (:meth:`triage`) before the next request."""
        passed = check_matches_cold_reference(
            self.sink, result.outcome, cold.outcome, config_sha256=self.config_sha256
        )
        self.count_check(passed)
        if not passed and result.outcome.ok and cold.outcome.ok:
            await self.triage(result.outcome, cold.outcome, "matches_cold_reference")
        return passed

    async def triage(self, outcome: Outcome, reference: Outcome | None, trigger: str) -> None:
        """Re-send a divergent answer's payload under a fresh salt and classify the divergence
        (``divergence.triaged``; experiments/_triage.py). Once per request."""
        sent = self._sent.get(outcome.request_id)
        if sent is None or outcome.request_id in self._triaged:
            return
        self._triaged.add(outcome.request_id)
        from ._triage import triage

        await triage(self, sent, outcome, reference, trigger)

    async def ensure_isolation_certified(self) -> None:
        """Before an ON block's first measured request, once per ON config and run: the
        isolation certificate (``isolation.certified``; experiments/_isolation.py)."""
        if self.arm != "ON" or self.config_sha256 in self.ctx.certified:
            return
        self.ctx.certified.add(self.config_sha256)
        from ._isolation import certify

        await certify(self)

    async def probe(
        self,
        messages: Messages,
        *,
        replica: int,
        namespace: str,
        probe: str,
        step: str,
        key: str,
        max_tokens: int | None = None,
        ignore_eos: bool = False,
        logprobs: bool = False,
        fixture: Fixture | None = None,
    ) -> Probed:
        """One recorded single-request window that is not measured and not checked: a request
        of the isolation certificate or of divergence triage (``request.sent.probe``)."""
        rep = self.replica(replica)
        spec = self._request_spec(
            messages,
            rep,
            namespace=namespace,
            limit=max_tokens or self._default_max_tokens(),
            ignore_eos=ignore_eos,
            workload=probe,
            step=step,
            key=key,
            fixture=fixture,
            prompt_tokens=None,
            meta={"probe": probe},
        )
        if logprobs:
            top = max(2, int(spec.body.get("top_logprobs") or 0))
            spec = dataclasses.replace(spec, body={**spec.body, "logprobs": True, "top_logprobs": top})
        seconds = 0.0

        async def send(s: RequestSpec) -> Outcome:
            nonlocal seconds
            t0 = time.perf_counter()
            try:
                return await self.ctx.send(s, self.sink)
            finally:
                seconds = time.perf_counter() - t0

        outcome, delta = await self.scraper.single(spec, rep.index, send=send)
        before, after = self.scraper.last_samples
        self.ctx.counters.probes += 1
        if not outcome.ok and not await self._still_healthy(rep):
            self.sink.flush()
            raise BlockFailed(f"replica {rep.index} unhealthy after {outcome.error}", rep.index)
        return Probed(Result(outcome, delta, seconds), before, after)

    async def warmups(self, count: int, tokens: int) -> None:
        """``count`` warmups round-robin over every replica (each gets at least one).

        ``count`` 0 sends none, except on targets that need every replica warmed
        before measuring (real engines): then each replica still gets one.
        """
        for i in range(self.ctx.warmup_count(count)):
            key = self.ctx.fixture_key("warmup", i)
            ns = self.ctx.namespace("warmup", i)
            fx = await self.ctx.fixture(key, tokens, ns)
            await self.request(
                fx.messages,
                replica=i % len(self.replicas),
                namespace=ns,
                workload="warmup",
                step="cold",
                key=f"warmup/{i}",
                warmup=True,
                fixture=fx,
                prompt_tokens=fx.prompt_tokens,
            )
        self.sink.flush()

    async def session(
        self,
        history: SessionHistory,
        *,
        session: str,
        namespace: str,
        replicas: Sequence[int],
        placement: str,
        key: str,
        workload: str = "session",
    ) -> list[Result]:
        """A sequential session; each turn is a single-request window on ``replicas[t]``."""
        results: list[Result] = []
        fx = history.fixture
        for turn in history.turns:
            results.append(
                await self.request(
                    turn.messages,
                    replica=replicas[turn.index % len(replicas)],
                    namespace=namespace,
                    workload=workload,
                    step="turn",
                    key=f"{key}/t{turn.index}",
                    expected=fx.expected,
                    independent=turn.index == 0,
                    fixture=fx,
                    prompt_tokens=turn.prompt_tokens,
                    session=session,
                    turn=turn.index,
                    placement=placement,
                )
            )
        self.sink.emit(
            "session.finished",
            {
                "session": session,
                "placement": placement,
                "turns": len(results),
                "wall_s": sum(r.seconds for r in results),
                "nominal_tokens": fx.nominal_tokens,
                "replicas": [replicas[t % len(replicas)] for t in range(len(results))],
                "requests": [r.outcome.request_id for r in results],
                "workload": workload,
            },
        )
        self.sink.flush()
        return results

    # --- concurrent windows -------------------------------------------------------------

    async def window(
        self, sessions: Sequence[SessionPlan], *, window: str, placement: str, workload: str = "concurrency"
    ) -> list[Outcome]:
        """Sessions run concurrently (turns sequential within each); counters read per window.

        Turns whose answers fail their exact values are triaged after the window (a re-send
        inside it would change the load being measured)."""
        await self.ensure_isolation_certified()
        urls: dict[int | str, str] = {r.index: r.endpoint for r in self.replicas}
        outcomes: list[Outcome] = []
        diverged: list[Outcome] = []
        async with self.scraper.window(urls, window) as state:
            t0 = time.perf_counter()
            try:
                async with asyncio.TaskGroup() as group:
                    tasks = [
                        group.create_task(self._window_session(s, window, workload, diverged))
                        for s in sessions
                    ]
            except BaseExceptionGroup as group_error:
                raise _first(group_error) from None
            wall = time.perf_counter() - t0
            for task in tasks:
                outcomes.extend(task.result())
        if self.arm == "OFF":
            for replica, delta in state.deltas.items():
                self.count_check(
                    check_no_external_hits_off(
                        self.sink, delta, window=window, replica=replica, config_sha256=self.config_sha256
                    )
                )
        nominal = sessions[0].history.fixture.nominal_tokens if sessions else None
        self.sink.emit(
            "window.finished",
            {
                "window": window,
                "placement": placement,
                "sessions": len(sessions),
                "requests": len(outcomes),
                "output_tokens": sum(o.output_tokens or 0 for o in outcomes),
                "wall_s": wall,
                "nominal_tokens": nominal,
                "replicas": sorted(urls),
                "workload": workload,
                "failed_requests": sum(not o.ok for o in outcomes),
            },
        )
        self.sink.flush()
        for outcome in diverged:
            await self.triage(outcome, None, "exact_values")
        return outcomes

    async def _window_session(
        self, plan: SessionPlan, window: str, workload: str, diverged: list[Outcome]
    ) -> list[Outcome]:
        """One session of a window: the single-request path's steps, counters read by the window."""
        fx = plan.history.fixture
        outcomes = []
        for turn in plan.history.turns:
            rep = self.replica(plan.replicas[turn.index % len(plan.replicas)])
            meta = {
                "session": plan.session,
                "window": window,
                "turn": turn.index,
                "placement": plan.placement,
            }
            spec = self._request_spec(
                turn.messages,
                rep,
                namespace=plan.namespace,
                limit=self._answer_limit(fx),
                ignore_eos=False,
                workload=workload,
                step="turn",
                key=f"{plan.key}/t{turn.index}",
                fixture=fx,
                prompt_tokens=turn.prompt_tokens,
                meta=meta,
                checked=True,
            )
            outcome = await self.ctx.send(spec, self.sink)
            if self._answer_checks(outcome, fx.expected, turn.index == 0, turn.prompt_tokens):
                key, limit = f"{plan.key}/t{turn.index}", self._answer_limit(fx)
                self._sent[outcome.request_id] = Sent(
                    turn.messages, rep.index, plan.namespace, limit, False, key, fx
                )
                diverged.append(outcome)
            outcomes.append(outcome)
            await self._after(outcome, rep, False)
        return outcomes

"""One simulated vLLM replica: its HTTP surface, timing and request log."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from ._answers import Output, compose_output
from ._arrival import arrival, arrival_middleware
from ._config import VLLM_VERSION, SimConfig
from ._engine import Prefill, ReplicaEngine
from ._faults import FaultSet
from ._protocol import (
    ApiError,
    CompletionRequest,
    chunk,
    error_response,
    full_body,
    parse_completion,
    parse_tokenize,
    sse,
    token_logprobs,
    usage,
)
from ._tier import SharedTier

__all__ = ["SimReplica"]

# Below this many seconds a due token is written with the next batch instead
# of sleeping: asyncio cannot sleep that finely, and real SSE batches too.
_MIN_SLEEP_S = 0.001
# Top-1 minus top-2 logprob of every token that is not a near tie: a confident greedy choice.
_CONFIDENT = 9.0


@dataclass
class _Call:
    """One completion request in flight."""

    req: CompletionRequest
    rid: str
    entry: dict[str, Any]
    t_arrival: float
    pre: Prefill | None = None
    ordinal: int = 0


class SimReplica:
    """A replica: engine state plus the aiohttp application serving it."""

    def __init__(
        self, index: int, config: SimConfig, tier: SharedTier, faults: FaultSet, shared: bool
    ) -> None:
        self.index = index
        self.config = config
        self.engine = ReplicaEngine(index, config, tier, faults, shared)
        self.requests: deque[dict[str, Any]] = deque(maxlen=config.request_log_size)
        self.dead = False
        self._gpu = asyncio.Lock()  # one prefill at a time, as one GPU
        self._ordinal = 0
        self._gpu_free_at = 0.0  # monotonic end of the last modelled prefill
        self._waiting = 0
        self._running = 0

    @property
    def faults(self) -> FaultSet:
        return self.engine.faults

    def make_app(self) -> web.Application:
        # 256k-token prompts; the middleware keeps each request's arrival its own (_arrival.py).
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[arrival_middleware])
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/version", self._version)
        app.router.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        app.router.add_get("/sim/requests", self._log)
        app.router.add_delete("/sim/requests", self._clear_log)
        return app

    # --- small endpoints -------------------------------------------------

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(status=503 if self.dead else 200)

    async def _metrics(self, _: web.Request) -> web.Response:
        m = self.engine.metrics
        # _running counts every request in flight; vLLM's gauge excludes queued ones.
        m.gauge(m.running, self._running - self._waiting)
        m.gauge(m.waiting, self._waiting)
        return web.Response(body=m.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _reset_prefix_cache(self, _: web.Request) -> web.Response:
        """vLLM's (dev-mode) endpoint: drop every cached prefix block of this replica."""
        engine = self.engine
        engine.cache.clear()
        engine.metrics.gauge(engine.metrics.kv_usage, engine.cache.usage())
        return web.Response(status=200)

    async def _models(self, _: web.Request) -> web.Response:
        name = self.config.model_name
        model = {
            "id": name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": name,
            "parent": None,
            "max_model_len": self.config.max_model_len,
            "permission": [],
        }
        return web.json_response({"object": "list", "data": [model]})

    async def _version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def _tokenize(self, request: web.Request) -> web.Response:
        try:
            ids = parse_tokenize(await _json(request))
        except ApiError as e:
            return e.response()
        body = {
            "count": len(ids),
            "max_model_len": self.config.max_model_len,
            "tokens": list(ids),
            "token_strs": None,
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")

    async def _log(self, _: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(list(self.requests)), content_type="application/json")

    async def _clear_log(self, _: web.Request) -> web.Response:
        self.requests.clear()
        return web.Response(status=204)

    # --- completions -----------------------------------------------------

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def _complete(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        t_arrival = arrival(request)
        try:
            req = parse_completion(
                await _json(request),
                chat=chat,
                model_name=self.config.model_name,
                max_model_len=self.config.max_model_len,
            )
        except ApiError as e:
            return e.response()
        if self.dead:
            return error_response(503, "The engine is dead.")
        self._ordinal += 1
        status = self.faults.http_error(self.index, self._ordinal)
        if status is not None:
            return error_response(status, "Simulated engine failure (http-errors fault).")
        call = self._new_call(request, req, t_arrival)
        call.ordinal = self._ordinal
        self._running += 1
        try:
            if req.stream:
                return await self._stream(request, call)
            return await self._full(request, call)
        finally:
            self._running -= 1

    def _new_call(self, request: web.Request, req: CompletionRequest, t: float) -> _Call:
        header_id = request.headers.get("X-Request-Id")
        base = header_id or uuid.uuid4().hex
        rid = ("chatcmpl-" if req.chat else "cmpl-") + base
        entry: dict[str, Any] = {
            "request_id": header_id or rid,
            "response_id": rid,
            "replica": self.index,
            "endpoint": request.path,
            "stream": req.stream,
            "t_arrival_monotonic": t,
            "t_first_emit_unix": None,
            "t_first_emit_monotonic": None,
            "prompt_tokens": len(req.token_ids),
            "local_hit_tokens": None,
            "external_hit_tokens": None,
            "output_tokens": 0,
            "finish_reason": None,
            "truncated": False,
            "tainted": False,
        }
        self.requests.append(entry)
        return _Call(req, rid, entry, t)

    async def _sleep(self, seconds: float) -> None:
        delay = seconds * self.config.time_scale
        if delay > 0:
            await asyncio.sleep(delay)

    async def _prefill(self, call: _Call) -> Output:
        """Wait for the GPU, look up hits, spend the prefill time, store state.

        The modelled time runs from the request's arrival (when its bytes
        reached the socket, _arrival.py), or from the end of the previous
        request's modelled prefill if the GPU was still busy, to a deadline;
        the server's own work (being scheduled to read the request, parsing,
        tokenizing, hashing) is spent inside it, so the first token goes out at the deadline, not at
        the deadline plus that work (unless the work alone takes longer).
        """
        self._waiting += 1
        async with self._gpu:
            self._waiting -= 1
            pre = call.pre = self.engine.schedule(call.req)
            call.entry.update(
                local_hit_tokens=pre.local_hits,
                external_hit_tokens=pre.external_hits,
                tainted=bool(pre.taints),
            )
            delay = self.config.latency.prefill_s(pre.prompt_tokens, pre.local_hits, pre.external_hits)
            start = max(call.t_arrival, self._gpu_free_at)
            deadline = start + (delay + self._slow_start_s()) * self.config.time_scale
            self._gpu_free_at = deadline
            call.entry["t_modelled_first_monotonic"] = deadline
            self.engine.store(call.req, pre)
            output = self._output(call.req, pre, call.ordinal)
            wait = deadline - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        return output

    def _slow_start_s(self) -> float:
        fault = self.faults.replica(self.index, "slow-start")
        if fault is None or self._ordinal > fault.int_param("requests"):
            return 0.0
        return fault.float_param("delay")

    def _output(self, req: CompletionRequest, pre: Prefill, ordinal: int) -> Output:
        digest = (
            _text_digest(req.prompt_text)
            if req.prompt_text is not None
            else hashlib.sha256(orjson.dumps(req.token_ids)).digest()
        )
        max_tokens = req.max_tokens or self.config.max_model_len - pre.prompt_tokens
        tie = self.faults.near_tie(self.index, ordinal)
        return compose_output(
            prompt_text=req.prompt_text,
            question_text=req.question_text,
            prompt_digest=digest,
            seed=req.seed,
            taints=pre.taints,
            max_tokens=max_tokens,
            ignore_eos=req.ignore_eos,
            thinking=req.chat and req.thinking,
            near_tie=None if tie is None else tie[1],
        )

    def _logprobs(self, call: _Call, output: Output, k: int) -> dict[str, Any] | None:
        """Token ``k``'s candidates when asked: confident (margin ``_CONFIDENT``), except at a
        near tie, whose runner-up trails by the fault's margin."""
        if not call.req.top_logprobs:
            return None
        token = output.pieces[k]
        tie = self.faults.near_tie(self.index, call.ordinal)
        if tie is not None and k == output.tie_index and output.tie_alternative is not None:
            best = -0.69
            candidates = [(token, best), (output.tie_alternative, best - tie[0])]
        else:
            best = -0.0001
            candidates = [(token, best), (" the" if token != " the" else " cache", best - _CONFIDENT)]
        for extra in range(2, call.req.top_logprobs):
            candidates.append((f" alt{extra}", best - _CONFIDENT - extra))
        return token_logprobs(token, candidates[: max(1, call.req.top_logprobs)], chat=call.req.chat)

    def _mark_first(self, call: _Call) -> None:
        """Record the server's own first-token time, just before the write."""
        mono, unix = time.monotonic(), time.time()
        call.entry.update(t_first_emit_monotonic=mono, t_first_emit_unix=unix)
        assert call.pre is not None
        self.engine.count_prefill(call.pre, mono - call.t_arrival)

    def _finish(self, call: _Call, emitted: int, reason: str | None, truncated: bool) -> None:
        call.entry.update(output_tokens=emitted, finish_reason=reason, truncated=truncated)
        self.engine.count_finish(emitted, reason, time.monotonic() - call.t_arrival)
        if truncated:
            fault = self.faults.replica(self.index, "truncated-stream")
            self.dead = self.dead or (fault is not None and fault.int_param("die") == 1)

    def _usage(self, call: _Call, completion_tokens: int) -> dict[str, Any]:
        assert call.pre is not None
        cached = call.pre.cached if self.config.enable_prompt_tokens_details else None
        return usage(call.pre.prompt_tokens, completion_tokens, cached)

    def _truncate_after(self) -> int | None:
        fault = self.faults.replica(self.index, "truncated-stream")
        return None if fault is None else fault.int_param("after")

    async def _full(self, request: web.Request, call: _Call) -> web.StreamResponse:
        output = await self._prefill(call)
        n = len(call.req.token_ids)
        steps = sum(self.config.latency.decode_step_s(n + k) for k in range(1, len(output.pieces)))
        await self._sleep(steps)
        body = orjson.dumps(
            full_body(
                call.rid,
                self.config.model_name,
                chat=call.req.chat,
                text=output.text,
                finish_reason=output.finish_reason,
                usage_obj=self._usage(call, len(output.pieces)),
            )
        )
        headers = {"X-Request-Id": call.rid.split("-", 1)[1]}
        self._mark_first(call)
        if self._truncate_after() is None:
            self._finish(call, len(output.pieces), output.finish_reason, truncated=False)
            return web.Response(body=body, content_type="application/json", headers=headers)
        # The fault: the body stops half way, as when the engine dies mid-write.
        resp = web.StreamResponse(headers={**headers, "Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(body[: len(body) // 2])
        await resp.write_eof()
        self._finish(call, len(output.pieces), None, truncated=True)
        return resp

    async def _stream(self, request: web.Request, call: _Call) -> web.StreamResponse:
        # Headers go out before prefill, as vLLM's StreamingResponse does.
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Request-Id": call.rid.split("-", 1)[1],
            }
        )
        await resp.prepare(request)
        output = await self._prefill(call)
        try:
            await self._write_tokens(resp, call, output)
        except (ConnectionResetError, asyncio.CancelledError):
            self._finish(call, call.entry["output_tokens"], None, truncated=False)
            raise
        return resp

    def _token_event(self, call: _Call, output: Output, k: int, created: int) -> bytes:
        last = k == len(output.pieces) - 1
        event = sse(
            chunk(
                call.rid,
                self.config.model_name,
                created,
                chat=call.req.chat,
                text=output.pieces[k],
                finish_reason=output.finish_reason if last else None,
                logprobs=self._logprobs(call, output, k),
            )
        )
        if k == 0 and call.req.chat:
            opening = chunk(call.rid, self.config.model_name, created, chat=True, text=None, role=True)
            event = sse(opening) + event
        return event

    async def _write_tokens(self, resp: web.StreamResponse, call: _Call, output: Output) -> None:
        created, n = int(time.time()), len(call.req.token_ids)
        cut, buf = self._truncate_after(), bytearray()
        due = time.monotonic()
        for k in range(len(output.pieces)):
            if cut is not None and k >= cut:
                await resp.write(bytes(buf))
                await resp.write_eof()
                self._finish(call, k, None, truncated=True)
                return
            if k == 0:
                event = self._token_event(call, output, 0, created)
                self._mark_first(call)
                await resp.write(event)
                due = time.monotonic()
                call.entry["output_tokens"] = 1
                continue
            due += self.config.latency.decode_step_s(n + k) * self.config.time_scale
            if due - time.monotonic() > _MIN_SLEEP_S:
                if buf:
                    await resp.write(bytes(buf))
                    buf.clear()
                await asyncio.sleep(due - time.monotonic())
            buf += self._token_event(call, output, k, created)
            call.entry["output_tokens"] = k + 1
        if call.req.include_usage:
            buf += sse(
                {
                    "id": call.rid,
                    "object": "chat.completion.chunk" if call.req.chat else "text_completion",
                    "created": created,
                    "model": self.config.model_name,
                    "choices": [],
                    "usage": self._usage(call, len(output.pieces)),
                }
            )
        buf += b"data: [DONE]\n\n"
        await resp.write(bytes(buf))
        await resp.write_eof()
        self._finish(call, len(output.pieces), output.finish_reason, truncated=False)


@lru_cache(maxsize=64)
def _text_digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


async def _json(request: web.Request) -> Any:
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        raise ApiError(400, f"Invalid JSON body: {e}") from e

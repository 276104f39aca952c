"""The OpenAI-compatible request fields vLLM accepts, and its response shapes."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from ._tokenizer import SPECIAL_TOKENS, VOCAB_SIZE, encode_cached, render_chat

__all__ = [
    "ApiError",
    "CompletionRequest",
    "chunk",
    "error_response",
    "full_body",
    "parse_completion",
    "parse_tokenize",
    "sse",
    "token_logprobs",
    "usage",
]

_SALT_FORBIDDEN = ("@", "/", "\\", "\x00")
_MAX_SALT = 128
_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class ApiError(Exception):
    """An error vLLM answers with a JSON error body and this status."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def response(self) -> web.Response:
        return error_response(self.status, self.message, self.param)


def error_response(status: int, message: str, param: str | None = None) -> web.Response:
    """vLLM's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "Error"),
            "param": param,
            "code": status,
        }
    }
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


@dataclass(frozen=True)
class CompletionRequest:
    """What the sim uses of a /v1/completions or /v1/chat/completions body."""

    chat: bool
    prompt_text: str | None  # None when the prompt came as token ids
    token_ids: Sequence[int]  # memoised for text prompts (see encode_cached): never mutate
    question_text: str | None  # chat: the last user message; else the prompt
    max_tokens: int | None
    ignore_eos: bool
    seed: int | None
    temperature: float
    cache_salt: str | None
    stream: bool
    include_usage: bool
    thinking: bool
    top_logprobs: int = 0
    """Candidates per output token asked for (chat ``logprobs`` + ``top_logprobs``; completions
    ``logprobs``); 0: no logprobs."""


def _salt(body: Mapping[str, Any]) -> str | None:
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise ApiError(400, "Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    if len(salt) > _MAX_SALT or any(c in salt for c in _SALT_FORBIDDEN):
        raise ApiError(
            400,
            f"Parameter 'cache_salt' must be at most {_MAX_SALT} characters "
            "and contain none of '@', '/', '\\\\' or NUL.",
            "cache_salt",
        )
    return salt


def _int_field(body: Mapping[str, Any], name: str, minimum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"Parameter '{name}' must be an integer.", name)
    if minimum is not None and value < minimum:
        raise ApiError(400, f"Parameter '{name}' must be at least {minimum}, got {value}.", name)
    return value


def _thinking(body: Mapping[str, Any]) -> bool:
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ApiError(400, "Parameter 'chat_template_kwargs' must be an object.", "chat_template_kwargs")
    return bool(kwargs.get("enable_thinking", False))


def _chat_prompt(body: Mapping[str, Any], thinking: bool) -> tuple[str, str | None]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, Mapping) for m in messages):
        raise ApiError(400, "Parameter 'messages' must be a non-empty list of objects.", "messages")
    add_generation_prompt = bool(body.get("add_generation_prompt", True))
    text = render_chat(messages, add_generation_prompt=add_generation_prompt, enable_thinking=thinking)
    users = [m for m in messages if m.get("role") == "user"]
    question = render_chat(users[-1:], add_generation_prompt=False) if users else None
    return text, question


def _completion_prompt(body: Mapping[str, Any]) -> tuple[str | None, Sequence[int]]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one is accepted; larger batches are not simulated
    if isinstance(prompt, str) and prompt:
        return prompt, encode_cached(prompt)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        if any(t < 0 or t >= VOCAB_SIZE + len(SPECIAL_TOKENS) for t in prompt):
            raise ApiError(400, "Token id out of vocabulary.", "prompt")
        return None, list(prompt)
    raise ApiError(400, "Parameter 'prompt' must be a non-empty string or list of token ids.", "prompt")


def parse_completion(body: Any, *, chat: bool, model_name: str, max_model_len: int) -> CompletionRequest:
    """Validate a request body like vLLM does; raises ApiError."""
    if not isinstance(body, Mapping):
        raise ApiError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if model is not None and model != model_name:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")
    thinking = _thinking(body)
    if chat:
        text, question = _chat_prompt(body, thinking)
        ids: Sequence[int] = encode_cached(text)
        prompt_text: str | None = text
    else:
        prompt_text, ids = _completion_prompt(body)
        question = prompt_text
    max_tokens = _int_field(
        body,
        "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens",
        minimum=1,
    )
    _check_length(len(ids), max_tokens, max_model_len)
    temperature = body.get("temperature", 1.0)
    if not isinstance(temperature, int | float) or temperature < 0:
        raise ApiError(400, "Parameter 'temperature' must be a number >= 0.", "temperature")
    options = body.get("stream_options") or {}
    return CompletionRequest(
        chat=chat,
        prompt_text=prompt_text,
        token_ids=ids,
        question_text=question,
        max_tokens=max_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        seed=_int_field(body, "seed"),
        temperature=float(temperature),
        cache_salt=_salt(body),
        stream=bool(body.get("stream", False)),
        include_usage=isinstance(options, Mapping) and bool(options.get("include_usage")),
        thinking=thinking,
        top_logprobs=_top_logprobs(body, chat),
    )


def _top_logprobs(body: Mapping[str, Any], chat: bool) -> int:
    if not chat:
        return _int_field(body, "logprobs", minimum=0) or 0
    if not body.get("logprobs"):
        return 0
    return max(1, _int_field(body, "top_logprobs", minimum=0) or 0)


def token_logprobs(token: str, candidates: Sequence[tuple[str, float]], *, chat: bool) -> dict[str, Any]:
    """One output token's ``logprobs`` object, as vLLM streams it (``candidates`` best first)."""
    if chat:
        top = [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in candidates]
        return {"content": [{**top[0], "token": token, "top_logprobs": top}]}
    return {
        "tokens": [token],
        "token_logprobs": [candidates[0][1]],
        "top_logprobs": [dict(candidates)],
        "text_offset": [0],
    }


def _check_length(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> None:
    requested = prompt_tokens + (max_tokens or 0)
    if prompt_tokens >= max_model_len or requested > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {requested} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens or 0} in the completion). Please reduce the length.",
        )


def parse_tokenize(body: Any) -> Sequence[int]:
    """Token ids for a /tokenize body (``prompt`` or ``messages``)."""
    if not isinstance(body, Mapping):
        raise ApiError(400, "The request body must be a JSON object.")
    if "messages" in body:
        text, _ = _chat_prompt(body, _thinking(body))
        return encode_cached(text)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise ApiError(400, "Parameter 'prompt' must be a string.", "prompt")
    return encode_cached(prompt)


def usage(prompt_tokens: int, completion_tokens: int, cached: int | None) -> dict[str, Any]:
    """The usage object; ``cached`` None omits prompt_tokens_details' content."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
    }


def sse(obj: Any) -> bytes:
    """One server-sent event, as vLLM frames them."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chunk(
    rid: str,
    model: str,
    created: int,
    *,
    chat: bool,
    text: str | None,
    finish_reason: str | None = None,
    role: bool = False,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A streamed chunk; ``text`` None with chat+role gives the opening role chunk."""
    choice: dict[str, Any]
    if chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = None
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def full_body(
    rid: str, model: str, *, chat: bool, text: str, finish_reason: str, usage_obj: dict[str, Any]
) -> dict[str, Any]:
    """A non-streaming response body."""
    choice: dict[str, Any] = {
        "index": 0,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
    }
    if chat:
        choice["message"] = {
            "role": "assistant",
            "content": text,
            "reasoning_content": None,
            "tool_calls": [],
        }
    else:
        choice["text"] = text
        choice["prompt_logprobs"] = None
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage_obj,
    }

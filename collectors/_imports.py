"""Other benchmark tools' result files as events: ``import.recorded`` and one ``import.request`` each.

``vllm bench serve --save-result --save-detailed`` writes one JSON object whose
per-request figures are parallel lists (``ttfts``, ``itls``, ``input_lens``,
...); GuideLLM writes ``benchmarks[].requests.{successful,errored,incomplete}``
with a record per request. Both are read whole and checked before any event
is made, so a wrong or cut-short file is refused with its reason and nothing
is recorded. The events keep what the file says (the tool, its version, the
file's SHA-256, every request's figures) and nothing it does not: such a file
has no ON/OFF blocks, no hit counters and no checked answers, and the audit
says so.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ledger import LedgerError, NewEvent, new_id

__all__ = ["RESULT_TOOLS", "ResultFileError", "read_guidellm", "read_vllm_bench", "result_events"]


class ResultFileError(LedgerError, ValueError):
    """A tool's result file was refused (not that tool's format, cut short, a field of the wrong type)."""

    def __init__(self, tool: str, file: Path, message: str) -> None:
        super().__init__(f"{file.name} is not a readable {tool} result file: {message}; nothing was recorded")


@dataclass(frozen=True)
class ImportedRequest:
    """One request as the tool recorded it (None where it recorded nothing)."""

    ttft_s: float | None
    e2e_s: float | None
    prompt_tokens: int | None
    output_tokens: int | None
    itl_s: list[float] | None
    cached_tokens: int | None
    error: str | None


@dataclass(frozen=True)
class ImportedResults:
    """A result file's provenance, the tool's own summary figures and its requests."""

    tool: str
    tool_version: str | None
    model: str | None
    target: str | None
    summary: dict[str, Any]
    requests: list[ImportedRequest]


def _load(tool: str, file: Path, raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ResultFileError(tool, file, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        cut = " (the file ends early: truncated?)" if exc.pos >= len(raw.rstrip()) else ""
        raise ResultFileError(
            tool, file, f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}{cut}"
        ) from exc


def _number(tool: str, file: Path, where: str, value: Any, *, integer: bool = False) -> Any:
    """``value`` if it is a number (an integer where asked) or None; else the file is refused."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (integer and not isinstance(value, int))
        or not math.isfinite(value)
    ):
        kind = "an integer" if integer else "a finite number"
        raise ResultFileError(tool, file, f"{where} should be {kind} or null, got {value!r}")
    return value


def read_vllm_bench(file: Path, raw: bytes) -> ImportedResults:
    """``vllm bench serve``'s result JSON (``raw``, read from ``file``); needs ``--save-detailed``."""
    tool = "vllm-bench"
    data = _load(tool, file, raw)
    if not isinstance(data, dict) or ("ttfts" not in data and "completed" not in data):
        raise ResultFileError(tool, file, "no 'completed' or 'ttfts' field: not written by vllm bench serve")
    lists = ("ttfts", "latencies", "input_lens", "output_lens", "itls", "errors")
    if not all(isinstance(data.get(name), list) for name in lists):
        missing = [name for name in lists if not isinstance(data.get(name), list)]
        raise ResultFileError(
            tool, file, f"no per-request lists {missing} (write it with --save-result --save-detailed)"
        )
    n = len(data["ttfts"])
    uneven = {name: len(data[name]) for name in lists if len(data[name]) != n}
    if uneven:
        raise ResultFileError(tool, file, f"per-request lists of different lengths: ttfts {n}, {uneven}")
    requests = []
    for i in range(n):
        error = data["errors"][i]
        itls = data["itls"][i]
        if not isinstance(itls, list):
            raise ResultFileError(tool, file, f"itls[{i}] should be a list, got {itls!r}")
        failed = bool(error)
        requests.append(
            ImportedRequest(
                ttft_s=None if failed else _number(tool, file, f"ttfts[{i}]", data["ttfts"][i]),
                e2e_s=None if failed else _number(tool, file, f"latencies[{i}]", data["latencies"][i]),
                prompt_tokens=_number(tool, file, f"input_lens[{i}]", data["input_lens"][i], integer=True),
                output_tokens=_number(tool, file, f"output_lens[{i}]", data["output_lens"][i], integer=True),
                itl_s=[_number(tool, file, f"itls[{i}]", x) for x in itls],
                cached_tokens=None,  # vllm bench serve records none
                error=str(error) if failed else None,
            )
        )
    summary_keys = (
        "date",
        "backend",
        "num_prompts",
        "request_rate",
        "max_concurrency",
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_itl_ms",
    )
    version = data.get("vllm_version") or data.get("version")
    return ImportedResults(
        tool=tool,
        tool_version=None if version is None else str(version),
        model=_str_or_none(data.get("model_id")),
        target=None,
        summary={k: _finite(data[k]) for k in summary_keys if k in data},
        requests=requests,
    )


def _finite(value: Any) -> Any:
    """A summary figure as canonical JSON holds it: NaN and infinities become null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def read_guidellm(file: Path, raw: bytes) -> ImportedResults:
    """GuideLLM's JSON report (``--output kind=json``; ``raw``, read from ``file``): every request."""
    tool = "guidellm"
    data = _load(tool, file, raw)
    benchmarks = data.get("benchmarks") if isinstance(data, dict) else None
    if not isinstance(benchmarks, list):
        raise ResultFileError(tool, file, "no 'benchmarks' list: not a GuideLLM JSON report")
    requests: list[ImportedRequest] = []
    summary: dict[str, Any] = {"benchmarks": []}
    for b, bench in enumerate(benchmarks):
        groups = bench.get("requests") if isinstance(bench, dict) else None
        if not isinstance(groups, dict):
            raise ResultFileError(tool, file, f"benchmarks[{b}] has no 'requests' object")
        for status in ("successful", "errored", "incomplete"):
            records = groups.get(status) or []
            if not isinstance(records, list):
                raise ResultFileError(tool, file, f"benchmarks[{b}].requests.{status} should be a list")
            for i, rec in enumerate(records):
                requests.append(
                    _guidellm_request(file, f"benchmarks[{b}].requests.{status}[{i}]", status, rec)
                )
        strategy = ((bench.get("config") or {}).get("strategy") or {}).get("type_")
        ttft = ((bench.get("metrics") or {}).get("time_to_first_token_ms") or {}).get("successful") or {}
        summary["benchmarks"].append(
            {
                "strategy": strategy,
                "successful": len(groups.get("successful") or []),
                "errored": len(groups.get("errored") or []),
                "incomplete": len(groups.get("incomplete") or []),
                "median_ttft_ms": _finite(ttft.get("median")),
                "mean_ttft_ms": _finite(ttft.get("mean")),
                "duration": _finite(bench.get("duration")),
            }
        )
    backend = (((data.get("config") or {}).get("spec") or {}).get("backend")) or {}
    version = (data.get("metadata") or {}).get("guidellm_version")
    return ImportedResults(
        tool=tool,
        tool_version=_str_or_none(version),
        model=_str_or_none(backend.get("model")),
        target=_str_or_none(backend.get("target")),
        summary=summary,
        requests=requests,
    )


def _guidellm_request(file: Path, where: str, status: str, rec: Any) -> ImportedRequest:
    tool = "guidellm"
    if not isinstance(rec, dict):
        raise ResultFileError(tool, file, f"{where} should be an object")
    ttft_ms = _number(tool, file, f"{where}.time_to_first_token_ms", rec.get("time_to_first_token_ms"))
    latency = _number(tool, file, f"{where}.request_latency", rec.get("request_latency"))
    info = rec.get("info")
    error = info.get("error") if isinstance(info, dict) else None
    return ImportedRequest(
        ttft_s=None if ttft_ms is None else ttft_ms / 1e3,
        e2e_s=latency,
        prompt_tokens=_number(tool, file, f"{where}.prompt_tokens", rec.get("prompt_tokens"), integer=True),
        output_tokens=_number(tool, file, f"{where}.output_tokens", rec.get("output_tokens"), integer=True),
        itl_s=None,
        cached_tokens=_number(tool, file, f"{where}.cached_tokens", rec.get("cached_tokens"), integer=True),
        error=str(error) if error else (None if status == "successful" else status),
    )


RESULT_TOOLS: Mapping[str, Callable[[Path, bytes], ImportedResults]] = {
    "vllm-bench": read_vllm_bench,
    "guidellm": read_guidellm,
}


def result_events(tool: str, file: Path) -> list[NewEvent]:
    """The events recording ``file``, a result file of ``tool``, as a run of its own.

    Raises :class:`ResultFileError` (nothing made) if the file is not what
    ``tool`` writes.
    """
    if tool not in RESULT_TOOLS:
        raise ResultFileError(tool, file, f"unknown tool; known: {', '.join(sorted(RESULT_TOOLS))}")
    raw = file.read_bytes()
    results = RESULT_TOOLS[tool](file, raw)
    if not results.requests:
        raise ResultFileError(tool, file, "no per-request records")
    run_id = new_id()
    recorded = NewEvent(
        "import.recorded",
        {
            "tool": results.tool,
            "tool_version": results.tool_version,
            "file_name": file.name,
            "file_sha256": hashlib.sha256(raw).hexdigest(),
            "file_bytes": len(raw),
            "requests": len(results.requests),
            "model": results.model,
            "target": results.target,
            "summary": results.summary,
        },
        run_id=run_id,
    )
    requests = [
        NewEvent(
            "import.request",
            {
                "index": i,
                "tool": results.tool,
                "ttft_s": r.ttft_s,
                "e2e_s": r.e2e_s,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "itl_s": r.itl_s,
                "cached_tokens": r.cached_tokens,
                "error": r.error,
            },
            run_id=run_id,
        )
        for i, r in enumerate(results.requests)
    ]
    return [recorded, *requests]

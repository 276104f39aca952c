"""Collectors: turn one source of truth into ledger events.

The request path (used by experiments)::

    from collectors import (RequestSpec, Outcome, EventSink, send_request,
                            scrape_metrics, record_scrape, hits_between, assertion_event,
                            host_inventory, code_version, package_versions)

- :func:`send_request` streams one request and emits ``request.sent`` and
  ``response.received`` (failures recorded, never raised);
  :func:`run_concurrently` bounds how many are in flight. Its ``method``
  (:data:`TTFT_METHODS`) says how TTFT is dated; each response records it.
- :func:`scrape_metrics` / :func:`record_scrape` / :func:`hits_between`, and
  :class:`Scraper`, which wraps a single request (or a concurrent window)
  in before/after scrapes and emits ``hits.observed``.
- ``check_*`` emit ``assertion.evaluated`` (rules in ``collectors._assertions``).
- :func:`host_inventory`, :func:`code_version`, :func:`package_versions`,
  :class:`GpuSampler` for provenance.

GPU byte probes live in ``collectors.probes``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledger._lazy import lazy_exports

if TYPE_CHECKING:
    from ._assertions import (
        assertion_event,
        check_counters_match,
        check_exact_values,
        check_full_prefix_hit,
        check_matches_cold_reference,
        check_no_external_hits_off,
        check_output_length,
        check_stream_complete,
        check_zero_hits,
        extract_json_object,
        shareable_prefix,
    )
    from ._client import (
        DEFAULT_TTFT_METHOD,
        TTFT_METHODS,
        EventSink,
        Outcome,
        RequestSpec,
        payload_digest,
        request_params,
        response_data,
        run_concurrently,
        send_request,
    )
    from ._host import GpuSampler, code_version, gpu_inventory, host_inventory, package_versions
    from ._imports import RESULT_TOOLS, ResultFileError, result_events
    from ._metrics import (
        HitDelta,
        MetricsError,
        Scraper,
        counter_delta,
        hits_between,
        parse_exposition,
        record_hits,
        record_scrape,
        sample_key,
        scrape_metrics,
    )

# Imported on first use: ``python -m collectors.probes`` on a bare GPU host needs none of these
# modules' dependencies (httpx, orjson), only torch.
_EXPORTS: dict[str, str] = {
    "DEFAULT_TTFT_METHOD": "._client",
    "TTFT_METHODS": "._client",
    "EventSink": "._client",
    "GpuSampler": "._host",
    "HitDelta": "._metrics",
    "MetricsError": "._metrics",
    "Outcome": "._client",
    "RESULT_TOOLS": "._imports",
    "RequestSpec": "._client",
    "ResultFileError": "._imports",
    "Scraper": "._metrics",
    "assertion_event": "._assertions",
    "check_counters_match": "._assertions",
    "check_exact_values": "._assertions",
    "check_full_prefix_hit": "._assertions",
    "check_matches_cold_reference": "._assertions",
    "check_no_external_hits_off": "._assertions",
    "check_output_length": "._assertions",
    "check_stream_complete": "._assertions",
    "check_zero_hits": "._assertions",
    "code_version": "._host",
    "counter_delta": "._metrics",
    "extract_json_object": "._assertions",
    "gpu_inventory": "._host",
    "hits_between": "._metrics",
    "host_inventory": "._host",
    "package_versions": "._host",
    "parse_exposition": "._metrics",
    "payload_digest": "._client",
    "record_hits": "._metrics",
    "record_scrape": "._metrics",
    "request_params": "._client",
    "result_events": "._imports",
    "response_data": "._client",
    "run_concurrently": "._client",
    "sample_key": "._metrics",
    "scrape_metrics": "._metrics",
    "send_request": "._client",
    "shareable_prefix": "._assertions",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())


__all__ = [
    "DEFAULT_TTFT_METHOD",
    "RESULT_TOOLS",
    "TTFT_METHODS",
    "EventSink",
    "GpuSampler",
    "HitDelta",
    "MetricsError",
    "Outcome",
    "RequestSpec",
    "ResultFileError",
    "Scraper",
    "assertion_event",
    "check_counters_match",
    "check_exact_values",
    "check_full_prefix_hit",
    "check_matches_cold_reference",
    "check_no_external_hits_off",
    "check_output_length",
    "check_stream_complete",
    "check_zero_hits",
    "code_version",
    "counter_delta",
    "extract_json_object",
    "gpu_inventory",
    "hits_between",
    "host_inventory",
    "package_versions",
    "parse_exposition",
    "payload_digest",
    "record_hits",
    "record_scrape",
    "request_params",
    "response_data",
    "result_events",
    "run_concurrently",
    "sample_key",
    "scrape_metrics",
    "send_request",
    "shareable_prefix",
]

"""Making a target by name from the run's params.

``sim`` is built in. ``vllm`` comes from ``experiments/targets/vllm/target.py``
once it exists: that module defines ``PARAMS`` (its options with defaults,
settable by ``--param``) and ``make_target(params) -> Target``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from collectors import TTFT_METHODS

from .._params import CLIENT_PARAMS, TARGET_PARAMS, ParamError
from ..fixture_text import ASKED_LINES
from ._base import Target

__all__ = ["TARGETS", "check_target_params", "make_target", "target_defaults"]

TARGETS = ("sim", "vllm")


def _vllm_module() -> Any:
    try:
        return importlib.import_module("experiments.targets.vllm.target")
    except ModuleNotFoundError as exc:
        raise ParamError(f"the vllm target is not available: {exc}") from exc


def target_defaults(name: str) -> dict[str, Any]:
    """The options a target takes (``--param`` names) with their defaults, the client's included."""
    if name == "sim":
        return {**CLIENT_PARAMS, **TARGET_PARAMS}
    if name == "vllm":
        return {**CLIENT_PARAMS, **_vllm_module().PARAMS}
    raise ParamError(f"unknown target {name!r}; known: {', '.join(TARGETS)}")


def make_target(name: str, params: Mapping[str, Any]) -> Target:
    """The target ``name`` configured from the run's resolved params."""
    if name == "sim":
        from .sim.target import SimTarget

        try:
            return SimTarget(
                replicas=int(params["replicas"]),
                time_scale=float(params["time_scale"]),
                fault=params.get("sim_fault"),
                hash_seed=params.get("hash_seed", 0),
                capacity_blocks=int(params.get("sim_capacity_blocks", 65_536)),
                device_name=str(params.get("sim_device", "sim")),
                meaningful_up_to_tokens=params.get("sim_exact_values_up_to_tokens"),
            )
        except ValueError as exc:
            raise ParamError(str(exc)) from exc
    target: Target = _vllm_module().make_target(dict(params))
    return target


def check_target_params(name: str, params: Mapping[str, Any]) -> None:
    """Refuse bad target options before anything is written (ParamError)."""
    method = params.get("ttft_method")
    if method not in TTFT_METHODS:
        raise ParamError(f"ttft_method must be one of {', '.join(TTFT_METHODS)}, got {method!r}")
    asked = params.get("asked_lines", "spot")
    if asked not in ASKED_LINES:
        raise ParamError(f"asked_lines must be one of {', '.join(ASKED_LINES)}, got {asked!r}")
    if name != "sim":
        _vllm_module().check_params(dict(params))
        return
    from .sim import FaultSet

    try:
        FaultSet(params.get("sim_fault"))
    except ValueError as exc:
        raise ParamError(f"sim_fault: {exc}") from exc
    if not isinstance(params["replicas"], int) or params["replicas"] < 2:
        raise ParamError("replicas must be an integer of at least 2")
    if params["time_scale"] < 0:
        raise ParamError("time_scale must be >= 0")
    capacity = params.get("sim_capacity_blocks", 65_536)
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
        raise ParamError(f"sim_capacity_blocks must be a positive integer, got {capacity!r}")
    device = params.get("sim_device", "sim")
    if not isinstance(device, str) or not device.strip():
        raise ParamError(f"sim_device must be a non-empty string, got {device!r}")
    limit = params.get("sim_exact_values_up_to_tokens")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ParamError(f"sim_exact_values_up_to_tokens must be a positive integer or null, got {limit!r}")

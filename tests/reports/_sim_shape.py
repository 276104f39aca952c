"""The small screening and validation shape that the sim pipeline and audit tests run."""

from __future__ import annotations

FAST = ["--param", "time_scale=0.001", "--no-progress"]
_SHAPE = [
    "sizes=[1000,2000]",
    "session_sizes=[1000]",
    "generation_sizes=[1000]",
    "generation_outputs=[16]",
    "window_sessions=[2]",
    "window_size=1000",
    "session_turns=3",
    "window_turns=2",
    "chains=1",
    "sessions=1",
    "warmups=1",
]
SMALL = [arg for p in _SHAPE for arg in ("--param", p)]
VALIDATION = ["--param", "size=2000", "--param", "reverse_size=1000", "--param", "session_size=1000"]

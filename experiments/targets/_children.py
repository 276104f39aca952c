"""Child processes of a target: tied to the runner's life."""

from __future__ import annotations

import contextlib
import signal
import sys

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent thread exits (Linux; elsewhere a no-op).

    Pass as ``preexec_fn``, so a SIGKILLed runner leaves no server behind.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

"""Secret redaction for launch records: secrets are never stored.

A value is redacted when its *name* looks secret (TOKEN, KEY, SECRET,
PASSWORD, ...) or its *shape* does (``hf_...``, ``sk-...``, ``ghp_...``,
``AKIA...``, credentials inside a URL). Command lines are redacted too: the
argument after a secret-named flag, and any secret-shaped argument.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

REDACTED = "[REDACTED]"

_SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY"
    r"|(^|[_-])KEY($|[_-])|AUTH|COOKIE|SESSION_?ID|SIGNATURE)",
    re.IGNORECASE,
)
_SECRET_VALUE = re.compile(
    r"(\bhf_[A-Za-z0-9]{10,}|\bsk-[A-Za-z0-9_-]{10,}|\bgh[pousr]_[A-Za-z0-9]{20,}"
    r"|\bAKIA[0-9A-Z]{16}\b|\bxox[abpr]-[A-Za-z0-9-]{10,}|\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+)"
)
# scheme://user:password@host → keep the user, hide the password.
_URL_CREDENTIALS = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*):([^@/\s]+)@")


def is_secret_name(name: str) -> bool:
    """True if an environment variable or flag name suggests a secret."""
    return bool(_SECRET_NAME.search(name))


def redact_value(value: str) -> str:
    """Hide secret-shaped substrings and URL passwords inside ``value``."""
    value = _URL_CREDENTIALS.sub(rf"\1:{REDACTED}@", value)
    return _SECRET_VALUE.sub(REDACTED, value)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with secret-named variables and secret-shaped values hidden."""
    return {k: REDACTED if is_secret_name(k) else redact_value(v) for k, v in sorted(env.items())}


def redact_tree(value: Any) -> Any:
    """A copy of a JSON value (a server's self-description) with secrets hidden at any depth:
    values under secret-named keys, and secret-shaped strings anywhere."""
    if isinstance(value, Mapping):
        return {str(k): REDACTED if is_secret_name(str(k)) else redact_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_tree(v) for v in value]
    if isinstance(value, str):
        return redact_value(value)
    return value


def redact_command(argv: Sequence[str]) -> list[str]:
    """A copy of ``argv`` with values of secret-named flags and secret-shaped arguments hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if arg.startswith("-") and is_secret_name(flag):
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_value(arg))
    return out

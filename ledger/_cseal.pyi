# Types of the native sealer (ledger/_cseal.c).
from collections.abc import Callable, Sequence
from typing import Any

def configure(
    sealed_type: type,
    event_type: type,
    seal: Callable[[Any], Any],
    parse_json: Callable[[str], Any],
    vocabulary: dict[str, Any],
    /,
) -> None: ...
def seal_many(events: Sequence[Any], parsed: bool = True) -> list[Any]: ...
def link(
    sealed: list[Any], last_seq: int, last_chain: str, events: bool = True, /
) -> tuple[list[Any], list[Any] | None, str]: ...
def configure_sqlite(
    connection_type: type, integrity_error: type, operational_error: type, module_path: str, probe: Any, /
) -> bool: ...
def insert(
    connection: Any, sealed: list[Any], last_seq: int, last_chain: str, events: bool = True, /
) -> tuple[list[Any] | None, str]: ...

WITHOUT_EVENTS: int

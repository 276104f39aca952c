"""The exception hierarchy of the ledger.

LedgerError
 ├── EventError          an event is malformed (unknown kind, missing/mistyped field)
 ├── ConflictError       an id already holds different content
 ├── ImportFileError     an import file is malformed; names line and field
 ├── QueryError          an analytics statement was refused or failed
 └── SchemaError         the database schema is missing or not at head
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base class of every error the ledger raises on purpose."""


class EventError(LedgerError, ValueError):
    """An event does not satisfy the envelope or the vocabulary; ``field`` names where."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.reason = message


class ConflictError(LedgerError):
    """An event id is already recorded with different content."""

    def __init__(self, event_id: str) -> None:
        super().__init__(f"event id {event_id} is already recorded with different content")
        self.event_id = event_id


class ImportFileError(LedgerError, ValueError):
    """A JSON Lines import was refused; nothing was written."""

    def __init__(self, line: int, field: str | None, message: str) -> None:
        where = f"line {line}" + (f", field {field!r}" if field else "")
        super().__init__(f"{where}: {message}")
        self.line = line
        self.field = field


class QueryError(LedgerError, ValueError):
    """An analytics statement was refused (it would write) or failed."""


class SchemaError(LedgerError):
    """The database has no ledger schema, or not the current one."""

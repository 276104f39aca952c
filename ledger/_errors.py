"""The exception tree: every error a ``ledger`` command shows derives from LedgerError.

Each class carries the exit status its command ends with (``exit_status``);
the root command (``ledger/_cli.py``) prints the message and exits with it,
in that one place. Exit statuses: 0 done and every check passed, 1 a check
failed (an assertion, the audit's gate, a replay mismatch), 2 bad input or a
refused operation, with nothing written.

LedgerError                 exit 2
 ├── EventError             an event is malformed (unknown kind, missing/mistyped field)
 ├── ConflictError          an id already holds different content
 ├── ImportFileError        an import file is malformed; names line and field
 ├── QueryError             an analytics statement was refused or failed
 ├── SchemaError            the database schema is missing or not at head
 ├── BackendError           the database URL names a backend the ledger does not use
 ├── CompactError           a compaction was refused (a ledger that does not verify, or open elsewhere)
 ├── ParamError             a --param or target option is bad (experiments)
 ├── ExperimentError        no such experiment, or a file not of the experiment form
 ├── ReplayError            the run to replay is missing or lacks what a replay needs
 ├── TargetError            the deployment could not be made, started or stopped
 │    ├── EngineError       an engine environment or the tiny model could not be built
 │    └── StartupError      a served process exited or did not answer in time
 ├── ResultFileError        another tool's result file is not of that tool
 ├── NoCudaError            a GPU probe found no usable CUDA device
 └── NoLMCacheError         a GPU probe found no importable LMCache

The last five are defined beside the code that raises them:
``experiments/targets/vllm/engines.py``, ``experiments/targets/vllm/_process.py``,
``collectors/_imports.py``, ``collectors/probes/_cuda.py`` and ``_lmcache.py``. Some of
those modules import nothing but the standard library and this module (``python -m
experiments.targets.vllm.engines ensure`` answers well under a second; the probes run on a
bare GPU host), so this module imports nothing, and ``import ledger`` loads the store only
when one of its names is first used (``ledger/__init__.py``). ``tests/test_error_tree.py``
walks the modules the CLI imports and checks that every exception class they define is in
this tree.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2


class LedgerError(Exception):
    """Root of every error a ``ledger`` command shows; ``exit_status`` is the command's."""

    exit_status: int = EXIT_BAD_INPUT


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
        # line 0: the file as a whole (e.g. a compressed file that does not decompress)
        where = (f"line {line}" if line else "the file") + (f", field {field!r}" if field else "")
        super().__init__(f"{where}: {message}")
        self.line = line
        self.field = field


class QueryError(LedgerError, ValueError):
    """An analytics statement was refused (it would write) or failed."""


class SchemaError(LedgerError):
    """The database has no ledger schema, or not the current one."""


class BackendError(LedgerError, ValueError):
    """The database URL names a backend other than SQLite or PostgreSQL."""


class CompactError(LedgerError):
    """``ledger compact`` refused to rewrite the file (it does not verify, or another connection has
    it open), or could not; the file is as it was."""


class ParamError(LedgerError, ValueError):
    """A bad ``--param``: unknown name, unparsable text or wrong type; or a bad target option."""


class ExperimentError(LedgerError, ValueError):
    """No such experiment, or a file not of the experiment form."""


class ReplayError(LedgerError, ValueError):
    """The run to replay does not exist or lacks what a replay needs."""


class TargetError(LedgerError):
    """The target could not start, restart or stop its deployment; nothing of the run was recorded."""

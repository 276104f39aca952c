"""Everything derived by querying the ledger, read-only: views, report, audit, attestation.

>>> from reports import open_source, derive_report, audit      # doctest: +SKIP
>>> src = open_source("sqlite:///ledger.db")                   # doctest: +SKIP
>>> derive_report(src)["accounting"]                           # doctest: +SKIP
"""

from __future__ import annotations

from ._audit import SEVERITY, Finding, audit, audit_json, audit_runs
from ._derive import derive_report
from ._needle import needle_figures
from ._render import to_json, to_markdown
from ._source import Source, open_source

__all__ = [
    "SEVERITY",
    "Finding",
    "Source",
    "audit",
    "audit_json",
    "audit_runs",
    "derive_report",
    "needle_figures",
    "open_source",
    "to_json",
    "to_markdown",
]

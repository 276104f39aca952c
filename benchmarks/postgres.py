"""A team's ledger on PostgreSQL: the first snapshot, the verification and a verified report + audit,
each through the native check of the rows' binary COPY and through the driver, side by side.

The ledger is the report benchmark's screening-shaped one (tests/_synthetic.py, 1M events by
default), appended through the ledger's own path into a database of its own on the server of
``--pg-url`` (default ``$KVLEDGER_TEST_PG_URL`` or ``postgresql://postgres@127.0.0.1:5432/test``),
named by the generator's version and kept between runs. Each pair is measured one after the
other in this process, the native path first, then the driver path (``KVLEDGER_READER`` and
``KVLEDGER_VERIFIER`` set to ``python``, as a build without the native parts would run): the
peer of each figure is the path it replaces. CPU seconds are this process's (and its verify
workers'); the server's own processes are not counted in them, the wall clock is. Each pair
also times one run's report + audit (the ledger's last run: its observations derived, every row
verified), what ``ledger attest --run`` costs on a team's ledger.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from ledger import Ledger, open_ledger, verify
from reports import audit, derive_report, open_source, to_json

from ._common import cpu_seconds, emit, timed
from .report import SIZES, _peak_rss_mb, _reset_peak_rss, envelopes, fill, generator_version

DEFAULT_PG_URL = os.environ.get("KVLEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
DRIVER = {"KVLEDGER_READER": "python", "KVLEDGER_VERIFIER": "python"}


@contextlib.contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _admin(url: str) -> Any:
    import psycopg

    libpq_url = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    return psycopg.connect(libpq_url, autocommit=True)


def _ledger(pg_url: str, label: str, count: int) -> tuple[Ledger, dict[str, float]]:
    """The kept ledger of ``label`` on the server of ``pg_url``, generated where it is missing or
    short (a database whose fill was cut off is dropped and made again)."""
    name = f"kvledger_bench_{label}_{generator_version()}"
    url = make_url(pg_url).set(drivername="postgresql+psycopg", database=name)
    setup: dict[str, float] = {}
    with _admin(pg_url) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists:
            ledger = open_ledger(url.render_as_string(hide_password=False))
            head = ledger.head()
            if head is not None and head.seq >= count:
                return ledger, setup
            ledger.close()
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    ledger = open_ledger(url.render_as_string(hide_password=False))
    with timed() as fill_t:
        fill(ledger, envelopes(count))
    setup["generate_and_fill_s"] = fill_t[0]
    return ledger, setup


def _snapshot(ledger: Ledger) -> tuple[float, float, Path]:
    """The first snapshot built from nothing (wall, CPU seconds), and where it lies."""
    root = Path(tempfile.mkdtemp(prefix="kvledger-pg-snapshot-"))
    cpu0 = cpu_seconds()
    with timed() as t:
        source = open_source(ledger, root)
        source.close()
    return t[0], cpu_seconds() - cpu0, root


def _verify(ledger: Ledger, events: int) -> tuple[float, float]:
    cpu0 = cpu_seconds(children=True)
    with timed() as t:
        result = verify(ledger)
    assert result.ok and result.count == events, result
    return t[0], cpu_seconds(children=True) - cpu0


def _report(ledger: Ledger, root: Path) -> tuple[float, float, bool, float]:
    """``ledger attest``'s work: the verified report and the audit (wall, CPU seconds), whether
    its tables came from the rows checked as they were read, and the peak resident MB."""
    _reset_peak_rss()
    cpu0 = cpu_seconds(children=True)
    with timed() as t:
        source = open_source(ledger, root, verify=True)
        try:
            to_json(derive_report(source))
            source.rederive()
            findings = audit(source)
            checked = source.analytics.checked is not None
        finally:
            source.close()
    assert not [f for f in findings if f.severity == "blocking"], findings[:3]
    return t[0], cpu_seconds(children=True) - cpu0, checked, _peak_rss_mb()


def _run_report(ledger: Ledger, root: Path, run: str) -> tuple[float, float]:
    """``ledger attest --run RUN``'s work: that run's observations derived, every row verified."""
    cpu0 = cpu_seconds(children=True)
    with timed() as t:
        source = open_source(ledger, root, verify=True, runs=[run])
        try:
            to_json(derive_report(source, run))
            source.rederive()
            findings = audit(source, run)
        finally:
            source.close()
    assert not [f for f in findings if f.severity == "blocking"], findings[:3]
    return t[0], cpu_seconds(children=True) - cpu0


def measure(pg_url: str, label: str, repeat: int) -> dict[str, Any]:
    ledger, setup = _ledger(pg_url, label, SIZES[label])
    head = ledger.head()
    events = head.seq if head else 0
    runs: dict[str, list[dict[str, Any]]] = {"copy": [], "driver": []}
    last_run = [e.run_id for e in ledger.events(kind="run.started") if e.run_id is not None][-1]
    roots: list[Path] = []
    try:
        for _ in range(repeat):
            for path, env in (("copy", {}), ("driver", DRIVER)):
                with _env(env):
                    snapshot_s, snapshot_cpu, root = _snapshot(ledger)
                    roots.append(root)
                    verify_s, verify_cpu = _verify(ledger, events)
                    report_s, report_cpu, checked, peak_rss_mb = _report(ledger, root)
                    run_report_s, run_report_cpu = _run_report(ledger, root, last_run)
                assert checked == (path == "copy"), (path, checked)
                runs[path].append(
                    {
                        "snapshot_s": snapshot_s,
                        "snapshot_cpu_s": snapshot_cpu,
                        "verify_s": verify_s,
                        "verify_cpu_s": verify_cpu,
                        "report_s": report_s,
                        "report_cpu_s": report_cpu,
                        "report_peak_rss_mb": peak_rss_mb,
                        "run_report_s": run_report_s,
                        "run_report_cpu_s": run_report_cpu,
                    }
                )
    finally:
        ledger.close()
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
    best = {path: {k: min(r[k] for r in rs) for k in rs[0]} for path, rs in runs.items()}
    copy, driver = best["copy"], best["driver"]
    print(
        f"{label:>5}: {events:,} events on PostgreSQL, best of {repeat}; binary COPY checked natively "
        f"against the driver path:\n"
        f"  first snapshot {copy['snapshot_s']:.2f} s against {driver['snapshot_s']:.2f} s "
        f"({driver['snapshot_s'] / copy['snapshot_s']:.2f}x)\n"
        f"  verify {events / copy['verify_s']:,.0f} events/s against {events / driver['verify_s']:,.0f} "
        f"({driver['verify_s'] / copy['verify_s']:.2f}x)\n"
        f"  report + audit {copy['report_s']:.2f} s against {driver['report_s']:.2f} s "
        f"({driver['report_s'] / copy['report_s']:.2f}x; CPU of this process {copy['report_cpu_s']:.2f} "
        f"against {driver['report_cpu_s']:.2f} s; peak RSS {copy['report_peak_rss_mb']:.0f} against "
        f"{driver['report_peak_rss_mb']:.0f} MB)\n"
        f"  one run's report + audit (its observations, every row verified) {copy['run_report_s']:.2f} s "
        f"against {driver['run_report_s']:.2f} s ({driver['run_report_s'] / copy['run_report_s']:.2f}x)\n"
        f"  load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        + "".join(f"; not counted: {k.removesuffix('_s')} {v:.1f} s" for k, v in setup.items()),
        flush=True,
    )
    return {
        "events": events,
        "copy": {k: round(v, 3) for k, v in copy.items()},
        "driver": {k: round(v, 3) for k, v in driver.items()},
        "snapshot_ratio_to_driver": round(driver["snapshot_s"] / copy["snapshot_s"], 3),
        "verify_events_per_s": round(events / copy["verify_s"]),
        "verify_ratio_to_driver": round(driver["verify_s"] / copy["verify_s"], 3),
        "report_ratio_to_driver": round(driver["report_s"] / copy["report_s"], 3),
        "run_report_seconds": round(copy["run_report_s"], 3),
        "run_report_ratio_to_whole": round(copy["report_s"] / copy["run_report_s"], 3),
        "run_report_ratio_to_driver": round(driver["run_report_s"] / copy["run_report_s"], 3),
        **{k: round(v, 1) for k, v in setup.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks postgres")
    parser.add_argument("--sizes", default="1m", help="Comma-separated: 250k, 1m, 2m, 10m.")
    parser.add_argument("--repeat", type=int, default=1, help="Pairs per size; the best of each is kept.")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="The server (its database is the admin's).")
    args = parser.parse_args()
    figures: dict[str, Any] = {
        "benchmark": "postgres",
        "generator_version": generator_version(),
        "cpus": os.cpu_count(),
        "load_avg_start": [round(x, 2) for x in os.getloadavg()],
    }
    for label in args.sizes.split(","):
        result = measure(args.pg_url, label, args.repeat)
        figures[f"detail_{label}"] = result
        figures[f"report_seconds_{label}"] = result["copy"]["report_s"]
        figures[f"report_ratio_to_driver_{label}"] = result["report_ratio_to_driver"]
        figures[f"snapshot_seconds_{label}"] = result["copy"]["snapshot_s"]
        figures[f"snapshot_ratio_to_driver_{label}"] = result["snapshot_ratio_to_driver"]
        figures[f"verify_events_per_s_{label}"] = result["verify_events_per_s"]
        figures[f"verify_ratio_to_driver_{label}"] = result["verify_ratio_to_driver"]
        figures[f"run_report_seconds_{label}"] = result["run_report_seconds"]
        figures[f"run_report_ratio_to_whole_{label}"] = result["run_report_ratio_to_whole"]
    figures["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    emit(figures)


if __name__ == "__main__":
    main()

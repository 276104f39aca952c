"""Shared fixtures: fresh ledger databases on SQLite and on the real PostgreSQL.

``pg_url`` creates a uniquely named database per test on the server at
``$KVLEDGER_TEST_PG_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``,
trust auth) through its ``postgres`` database, and drops it afterwards. If the
server cannot be reached the test FAILS, never skips: the PostgreSQL suite
must really run.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

PG_URL = os.environ.get("KVLEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _admin_connect() -> object:
    import psycopg

    url = make_url(PG_URL)
    try:
        return psycopg.connect(
            host=url.host or "127.0.0.1",
            port=url.port or 5432,
            user=url.username or "postgres",
            password=url.password,
            dbname="postgres",
            autocommit=True,
            connect_timeout=5,
        )
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is unreachable at {url.render_as_string(hide_password=True)}: {exc}")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite ledger URL on a fresh file in the test's tmp dir."""
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL of a fresh, empty database, dropped after the test."""
    name = f"kvledger_test_{uuid.uuid4().hex[:16]}"
    admin = _admin_connect()
    try:
        admin.execute(f'CREATE DATABASE "{name}"')  # type: ignore[attr-defined]
        url = make_url(PG_URL).set(drivername="postgresql+psycopg", database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[attr-defined]
        admin.close()  # type: ignore[attr-defined]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest) -> str:
    """Each backend in turn: a fresh SQLite file, then a fresh PostgreSQL database."""
    return str(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))

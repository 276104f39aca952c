"""Schema upgrades through Alembic, with the environment shipped in ``migrations/``."""

from __future__ import annotations

import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

import migrations


def alembic_config(connection: Connection | None = None) -> Config:
    """An Alembic config pointing at the packaged migrations."""
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str | None:
    """The newest revision shipped with this package."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(database: Engine) -> str | None:
    """The revision the database is at, or None for an empty database."""
    with database.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


#: How long a process waits for another one that is creating the same schema.
CONCURRENT_UPGRADE_S = 30.0


def upgrade(database: Engine) -> str | None:
    """Upgrade the database to the head revision; returns the revision now current.

    Two processes that open the same new database at once (a run and a reader
    polling it) both find it empty and both create the schema; SQLite runs the
    DDL outside a transaction, so the later one fails half-way ("table ...
    already exists"). Such a failure is retried until the other process has
    reached the head revision; any other error, or no progress in
    ``CONCURRENT_UPGRADE_S``, is raised.
    """
    head = head_revision()
    deadline = time.monotonic() + CONCURRENT_UPGRADE_S
    delay = 0.02
    while True:
        try:
            with database.begin() as connection:
                command.upgrade(alembic_config(connection), "head")
            break
        except DBAPIError as error:
            if not _created_concurrently(error) or time.monotonic() > deadline:
                raise
            if current_revision(database) == head:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
    return current_revision(database)


def _created_concurrently(error: DBAPIError) -> bool:
    text = str(error.orig).lower()
    return "already exists" in text or "database is locked" in text or "duplicate key" in text

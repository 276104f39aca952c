"""Schema upgrades through Alembic, with the environment shipped in ``migrations/``."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

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


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, or None for an empty database."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine) -> str | None:
    """Upgrade the database to the head revision; returns the revision now current."""
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "head")
    return current_revision(engine)

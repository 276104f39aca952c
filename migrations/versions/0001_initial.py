"""Initial ledger schema: append-only events, recorded heads, immutability triggers.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
PROTECTED = ("events", "heads")


def _create_tables() -> None:
    op.create_table(
        "events",
        sa.Column("seq", SEQ, primary_key=True, autoincrement=False),
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("ts", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("block_id", sa.String(64), nullable=True),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("chain", sa.String(64), nullable=False),
        sa.UniqueConstraint("id", name="events_id_key"),
    )
    op.create_index("ix_events_run_id", "events", ["run_id"])
    op.create_index("ix_events_kind", "events", ["kind"])
    op.create_table(
        "heads",
        sa.Column("seq", SEQ, primary_key=True, autoincrement=False),
        sa.Column("chain", sa.String(64), nullable=False),
        sa.Column("ts", sa.String(32), nullable=False),
    )


def _sqlite_triggers() -> None:
    for table in PROTECTED:
        for action in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER {table}_refuse_{action.lower()} BEFORE {action} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, 'kvledger: {table} is append-only, "
                f"{action} refused'); END"
            )


def _postgres_triggers() -> None:
    op.execute(
        "CREATE FUNCTION kvledger_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN RAISE EXCEPTION 'kvledger: % is append-only, % refused', TG_TABLE_NAME, TG_OP; "
        "END $$"
    )
    for table in PROTECTED:
        op.execute(
            f"CREATE TRIGGER {table}_refuse_change BEFORE UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION kvledger_refuse_change()"
        )
        op.execute(
            f"CREATE TRIGGER {table}_refuse_truncate BEFORE TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION kvledger_refuse_change()"
        )


def upgrade() -> None:
    _create_tables()
    if op.get_bind().dialect.name == "postgresql":
        _postgres_triggers()
    else:
        _sqlite_triggers()


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in PROTECTED:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_refuse_change ON {table}")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_refuse_truncate ON {table}")
        op.execute("DROP FUNCTION IF EXISTS kvledger_refuse_change()")
    op.drop_table("heads")
    op.drop_index("ix_events_kind", "events")
    op.drop_index("ix_events_run_id", "events")
    op.drop_table("events")

"""The ledger's tables as SQLAlchemy metadata (the migrations must agree with it)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

# On SQLite an INTEGER PRIMARY KEY aliases the rowid: the fastest append path.
SEQ_TYPE = BigInteger().with_variant(Integer(), "sqlite")

events = Table(
    "events",
    metadata,
    Column("seq", SEQ_TYPE, primary_key=True, autoincrement=False),
    Column("id", String(36), nullable=False),
    Column("ts", String(32), nullable=False),
    Column("kind", String(64), nullable=False),
    Column("run_id", String(64), nullable=True),
    Column("block_id", String(64), nullable=True),
    Column("data", Text, nullable=False),
    Column("digest", String(64), nullable=False),
    Column("chain", String(64), nullable=False),
    UniqueConstraint("id", name="events_id_key"),
)
Index("ix_events_run_id", events.c.run_id)
Index("ix_events_kind", events.c.kind)

# One row per committed append: lets verify detect a tail truncated below a recorded head.
heads = Table(
    "heads",
    metadata,
    Column("seq", SEQ_TYPE, primary_key=True, autoincrement=False),
    Column("chain", String(64), nullable=False),
    Column("ts", String(32), nullable=False),
)

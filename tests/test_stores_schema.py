"""workers/stores/schema.py: the store's tables written once, in each dialect's types.
(Migrating a store that holds rows, both stores: tests/test_store.py.)"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from keylane.workers.stores.postgres import PostgresDialect
from keylane.workers.stores.schema import ColumnTypes, schema_ddl
from keylane.workers.stores.sqlite import SqliteDialect

TABLES = {"records", "journal", "archived_ids", "shard_fences", "dead_letters", "parked", "held"}


def statements(ddl: str) -> list[str]:
    return [s.strip() for s in ddl.split(";") if s.strip()]


def test_each_dialects_types_fill_every_placeholder() -> None:
    types = ColumnTypes(bigint="BIG", real="FLOAT8", json="DOC", serial_key="SERIALKEY")
    ddl = schema_ddl(types)
    assert "{" not in ddl
    assert "}" not in ddl
    assert "id SERIALKEY," in ddl
    assert "fields DOC NOT NULL" in ddl
    assert "revision BIG NOT NULL" in ddl
    assert "updated_at FLOAT8 NOT NULL" in ddl
    assert schema_ddl(SqliteDialect.column_types) != schema_ddl(PostgresDialect.column_types)


def test_every_statement_creates_only_what_is_missing() -> None:
    for statement in statements(schema_ddl(SqliteDialect.column_types)):
        assert re.match(r"CREATE (TABLE|INDEX) IF NOT EXISTS ", statement), statement


def test_the_ddl_run_twice_on_a_sqlite_file_keeps_its_rows(tmp_path: Path) -> None:
    ddl = schema_ddl(SqliteDialect.column_types)
    with sqlite3.connect(tmp_path / "store.sqlite3") as conn:
        conn.executescript(ddl)
        conn.execute("INSERT INTO records VALUES ('contact:1', '{\"n\": 1}', 1, 0.0)")
        conn.executescript(ddl)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert tables >= TABLES
        assert conn.execute("SELECT key, revision FROM records").fetchall() == [("contact:1", 1)]

"""PostgreSQL store (``KEYLANE_STORE_URL=postgresql://...``).

Fields and review payloads are ``json`` (not ``jsonb``, which would rewrite large floats
as integers: the value read back must be the value written). The fence row is read
``FOR SHARE`` inside each write transaction, so an owner's write and a new owner's fence
advance (an ``UPDATE`` of the same row) are serialized: whichever commits second sees the
other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from keylane.routing.contract.errors import StoreUnavailable
from keylane.workers.stores.schema import ColumnTypes, schema_ddl
from keylane.workers.stores.sql import SqlStore
from keylane.workers.stores.sql_base import Cursor

_SCHEMA = schema_ddl(
    ColumnTypes(
        bigint="BIGINT", real="DOUBLE PRECISION", json="JSON", serial_key="BIGSERIAL PRIMARY KEY"
    )
)

# Serializes concurrent migrations (two workers starting at once) on a fixed lock id.
_MIGRATION_LOCK = 0x6B65796C616E65


class PostgresStore(SqlStore):
    """A :class:`~keylane.workers.stores.base.Store` in PostgreSQL."""

    json_param = "%s::json"

    def __init__(self, dsn: str, timeout_ms: int = 5000) -> None:
        self._dsn = dsn
        # Keep the URL's own options (e.g. -c search_path=...) and add the timeouts.
        params = conninfo_to_dict(dsn)
        options = f"-c statement_timeout={int(timeout_ms)} -c lock_timeout={int(timeout_ms)}"
        params["options"] = f"{params.get('options') or ''} {options}".strip()
        params.setdefault("connect_timeout", max(1, timeout_ms // 1000))
        try:
            self._conn = psycopg.connect(make_conninfo("", **params), autocommit=True)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc

    def json_out(self, column: str) -> str:
        return f"{column}::text"

    def _q(self, sql: str) -> str:
        return sql.replace("?", "%s")

    def migrate(self) -> None:
        with self._transaction() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            cur.execute(_SCHEMA)

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[Cursor]:
        try:
            with self._conn.transaction(), self._conn.cursor() as cur:
                yield _PgCursor(cur)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"PostgreSQL write failed: {exc}") from exc

    @contextmanager
    def _cursor(self) -> Iterator[Cursor]:
        try:
            with self._conn.cursor() as cur:
                yield _PgCursor(cur)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"PostgreSQL read failed: {exc}") from exc

    def _lock_fence(self, cur: Cursor, shard: int) -> int:
        cur.execute("SELECT token FROM shard_fences WHERE shard = %s FOR SHARE", (shard,))
        row = cur.fetchone()
        return int(row[0]) if row else 0


class _PgCursor:
    """psycopg's cursor, with ``execute`` accepting the same SQL text as SQLite's."""

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    def execute(self, sql: Any, params: Any = None) -> Any:
        return self._cur.execute(sql, params)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

"""PostgreSQL store (``KEYLANE_STORE_URL=postgresql://...``).

Fields and review payloads are ``json`` (not ``jsonb``, which would rewrite large floats
as integers: the value read back must be the value written). The fence row is read
``FOR SHARE`` inside each write transaction, so an owner's write and a new owner's fence
advance (an ``UPDATE`` of the same row) are serialized: whichever commits second sees the
other.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ...routing.contract.errors import StoreUnavailable
from .dialect import Cursor
from .schema import ColumnTypes

# Serializes concurrent migrations (two workers starting at once) on a fixed lock id.
_MIGRATION_LOCK = 0x6B65796C616E65
# The prune's one runner per schema (the two-key form: a space apart from the above).
_PRUNE_LOCK = 0x6B6C7072
# The prune vacuums a table once its dead rows are this many, and this share of its live
# ones (autovacuum's default share is 0.2).
_RECLAIM_ROWS = 1000
_RECLAIM_SHARE = 0.1


class PostgresDialect:
    """A :class:`~keylane.workers.stores.dialect.Dialect`: a PostgreSQL connection."""

    column_types = ColumnTypes(
        bigint="BIGINT", real="DOUBLE PRECISION", json="JSON", serial_key="BIGSERIAL PRIMARY KEY"
    )
    json_param = "?::json"
    fence_lock = " FOR SHARE"
    row_lock = " FOR UPDATE"

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

    def field_equals(self, column: str, name: str, value_json: str) -> tuple[str, list[Any]]:
        # jsonb's equality is JSON's (1 = 1.0, keys in any order); the cast is per row read,
        # the column stays json (see above).
        return f"({column}::jsonb -> ?::text) = ?::jsonb", [name, value_json]

    def migrate(self, ddl: str) -> None:
        with self.transaction() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            cur.execute(ddl)

    def add_column(self, table: str, column: str, ddl: str) -> None:
        with self.transaction() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            cur.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {ddl}")

    def has_table(self, name: str) -> bool:
        # to_regclass resolves the name on the connection's search_path, as every
        # statement of the store does.
        with self.cursor() as cur:
            cur.execute("SELECT to_regclass(?) IS NOT NULL", (name,))
            row = cur.fetchone()
            return bool(row and row[0])

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def transaction(self) -> Iterator[Cursor]:
        try:
            with self._conn.transaction(), self._conn.cursor() as cur:
                yield _PgCursor(cur)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"PostgreSQL write failed: {exc}") from exc

    def reclaim(self, table: str) -> bool:
        # Deleted rows stay in the table (dead) until a VACUUM makes their space reusable:
        # autovacuum does it, unless it is off or lagging, so the prune does not count on
        # it. A plain VACUUM takes no lock that writes wait for.
        with self.cursor() as cur:
            cur.execute(
                "SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables "
                "WHERE schemaname = current_schema() AND relname = ?",
                (table,),
            )
            row = cur.fetchone()
            if row is None or row[0] < max(_RECLAIM_ROWS, _RECLAIM_SHARE * row[1]):
                return False
            cur.execute("SET statement_timeout = 0")  # a large table takes its time
            try:
                cur.execute(f"VACUUM (ANALYZE) {table}")
            finally:
                cur.execute("RESET statement_timeout")
        return True

    @contextmanager
    def maintenance_lock(self) -> Iterator[bool]:
        # A session advisory lock, per schema (one database may hold several
        # deployments): the server drops it with the connection of a process that died.
        key = "?, hashtext(current_schema())"
        with self.cursor() as cur:
            cur.execute(f"SELECT pg_try_advisory_lock({key})", (_PRUNE_LOCK,))
            taken = bool(cur.fetchone()[0])
        try:
            yield taken
        finally:
            if taken:
                with self.cursor() as cur:
                    cur.execute(f"SELECT pg_advisory_unlock({key})", (_PRUNE_LOCK,))

    @contextmanager
    def cursor(self) -> Iterator[Cursor]:
        try:
            with self._conn.cursor() as cur:
                yield _PgCursor(cur)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"PostgreSQL read failed: {exc}") from exc


class _PgCursor:
    """psycopg's cursor, with ``execute`` taking SQLite's ``?`` placeholders."""

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Any:
        return self._cur.execute(sql.replace("?", "%s"), params)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

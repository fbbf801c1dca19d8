"""SQLite, the default store: one file in the data directory, WAL journal.

Several processes share the file: write transactions start with ``BEGIN IMMEDIATE`` so
that a writer takes the database lock before it reads the fence (no lock upgrade, no
deadlock), and wait up to ``busy_timeout`` for it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from ...routing.contract.errors import StoreUnavailable
from .dialect import Cursor
from .schema import ColumnTypes


class SqliteDialect:
    """A :class:`~keylane.workers.stores.dialect.Dialect`: one SQLite file's connection."""

    column_types = ColumnTypes(
        bigint="INTEGER", real="REAL", json="TEXT", serial_key="INTEGER PRIMARY KEY AUTOINCREMENT"
    )
    json_param = "?"
    # BEGIN IMMEDIATE already holds the database's write lock: no advance can interleave.
    fence_lock = ""
    row_lock = ""

    def __init__(
        self,
        path: Path,
        timeout_ms: int = 5000,
        synchronous: Literal["NORMAL", "FULL"] = "FULL",
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        try:
            # One thread uses a store at a time, but not always the one that opened it.
            self._conn = sqlite3.connect(
                path, timeout=timeout_ms / 1000, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute(f"PRAGMA synchronous = {synchronous}")
            self._conn.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open SQLite store {path}: {exc}") from exc

    def json_out(self, column: str) -> str:
        return column

    def field_equals(self, column: str, name: str, value_json: str) -> tuple[str, list[Any]]:
        # json_each takes the field's name literally (a path would need it quoted); its
        # type tells true from 1, and an integer and a real compare by value. An object or
        # an array is only matched by its kind here: SQLite compares them as text (1.0 is
        # not 1 inside), so the caller compares them as JSON.
        sql = (
            f"EXISTS (SELECT 1 FROM json_each({column}) AS f WHERE f.key = ? "
            "AND replace(f.type, 'real', 'integer') = replace(json_type(?), 'real', 'integer') "
            "AND (f.type IN ('object', 'array') OR f.atom IS json_extract(?, '$')))"
        )
        return sql, [name, value_json, value_json]

    def migrate(self, ddl: str) -> None:
        try:
            self._conn.executescript(ddl)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot create schema in {self.path}: {exc}") from exc

    def add_column(self, table: str, column: str, ddl: str) -> None:
        with self.cursor() as cur:
            cur.execute(f"PRAGMA table_info({table})")
            if any(row[1] == column for row in cur.fetchall()):
                return
        try:
            self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {ddl}")
        except sqlite3.OperationalError as exc:
            if "duplicate column" not in str(exc):  # another process added it first
                raise StoreUnavailable(f"cannot add {table}.{column}: {exc}") from exc

    def has_table(self, name: str) -> bool:
        with self.cursor() as cur:
            cur.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,))
            return cur.fetchone() is not None

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def transaction(self) -> Iterator[Cursor]:
        cur = self._conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            cur.close()
            raise StoreUnavailable(f"SQLite store busy: {exc}") from exc
        try:
            yield cur
        except sqlite3.OperationalError as exc:
            self._conn.rollback()
            raise StoreUnavailable(f"SQLite write failed: {exc}") from exc
        except BaseException:
            self._conn.rollback()
            raise
        else:
            try:
                cur.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                self._conn.rollback()
                raise StoreUnavailable(f"SQLite commit failed: {exc}") from exc
        finally:
            cur.close()

    def reclaim(self, table: str) -> bool:
        return False  # SQLite puts the pages it frees on its free list and reuses them

    @contextmanager
    def maintenance_lock(self) -> Iterator[bool]:
        # An advisory lock on a file beside the database: the kernel drops it with the
        # process that held it, so a prune killed mid-run never leaves it taken.
        try:
            import fcntl
        except ImportError:  # no flock (Windows): one process runs the prune
            yield True
            return
        with (self.path.parent / f"{self.path.name}.prune-lock").open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    @contextmanager
    def cursor(self) -> Iterator[Cursor]:
        cur = self._conn.cursor()
        try:
            yield cur
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"SQLite read failed: {exc}") from exc
        finally:
            cur.close()

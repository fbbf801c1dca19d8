"""What the SQL store asks of a database, and what its SQL modules share.

SQLite and PostgreSQL differ in these places only: how the connection opens (the
dialect's constructor), how a write transaction begins and ends, how the shard's fence
row is locked, how JSON goes in and out and how a field of it is compared, the
placeholder style (the dialect's cursor takes ``?``), the DDL's type names, and how the
prune's one runner is chosen. Everything else is written once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from .schema import ColumnTypes


class Cursor(Protocol):
    """The part of a DB-API cursor the store uses; SQL text takes ``?`` placeholders."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class Dialect(Protocol):
    """One database's connection and its way of doing what the store's SQL leaves open."""

    #: The DDL's column type names.
    column_types: ColumnTypes
    #: SQL text of a JSON parameter.
    json_param: str
    #: Appended to the fence row's ``SELECT`` in a write transaction to lock the row
    #: against a concurrent advance ("" where the transaction already holds that lock).
    fence_lock: str
    #: Appended to a ``SELECT`` of rows a transaction is about to delete, so that no
    #: other transaction changes them in between ("" where it holds the write lock).
    row_lock: str

    def json_out(self, column: str) -> str:
        """SQL that reads a JSON column as text."""
        ...

    def field_equals(self, column: str, name: str, value_json: str) -> tuple[str, list[Any]]:
        """A condition (SQL text and its parameters) that holds when the JSON object in
        ``column`` has the field ``name`` (taken literally) equal to the JSON value
        ``value_json``, as JSON compares: numbers by value, objects whatever their keys'
        order, ``true`` never ``1``. It may hold for more rows than that (never fewer):
        the caller compares what it reads again."""
        ...

    def transaction(self) -> AbstractContextManager[Cursor]:
        """A write transaction; commits on success, rolls back on any exception."""
        ...

    def cursor(self) -> AbstractContextManager[Cursor]:
        """A cursor for reads outside a transaction."""
        ...

    def migrate(self, ddl: str) -> None:
        """Run the schema's DDL."""
        ...

    def add_column(self, table: str, column: str, ddl: str) -> None:
        """Add ``column`` (``ddl``: its definition) to ``table`` unless it is there."""
        ...

    def has_table(self, name: str) -> bool:
        """Whether the table ``name`` exists (where the connection looks for tables)."""

    def reclaim(self, table: str) -> bool:
        """Make the space of ``table``'s deleted rows reusable if the database does not
        on its own and they have piled up; whether it did."""
        ...

    def maintenance_lock(self) -> AbstractContextManager[bool]:
        """One holder per store at a time, released when its process dies (see
        :meth:`RetentionStore.maintenance_lock`)."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


def dump_json(value: Any) -> str:
    """Compact, key-sorted JSON, so equal values store equal text."""
    return json.dumps(
        value, separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False
    )

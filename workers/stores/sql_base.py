"""What the SQL stores share: the cursor protocol, JSON text, and the dialect hooks.

Dialects differ in four places only: how a write transaction begins, how the shard's
fence row is locked, how JSON goes in and out, and the DDL. Subclasses supply those.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from keylane.workers.stores.base import Store


class Cursor(Protocol):
    """The part of a DB-API cursor the store uses."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: Any, params: Sequence[Any] = ...) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


def dump_json(value: Any) -> str:
    """Compact, key-sorted JSON, so equal values store equal text."""
    return json.dumps(
        value, separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False
    )


_DL_COLUMNS = (
    "id, created_at, source, event_id, record_key, shard, reason, {event}, {change}, "
    "revision_read, revision_found, attempts, error, status, status_by, status_at, note, retry_of"
)


class SqlBase(Store):
    """A store over a DB-API connection; dialects fill in the hooks below."""

    #: SQL text of a JSON parameter and of a JSON column read back as text.
    json_param = "?"

    def json_out(self, column: str) -> str:
        """SQL that reads a JSON column as text."""
        return column

    @abstractmethod
    @contextmanager
    def _transaction(self) -> Iterator[Cursor]:
        """A write transaction; commits on success, rolls back on any exception."""

    @abstractmethod
    @contextmanager
    def _cursor(self) -> Iterator[Cursor]:
        """A cursor for reads outside a transaction."""

    @abstractmethod
    def _lock_fence(self, cur: Cursor, shard: int) -> int:
        """Read (and lock against advances) the shard's newest fencing token; 0 if none."""

    def _q(self, sql: str) -> str:
        """Adapt ``?`` placeholders to the driver (overridden by PostgreSQL)."""
        return sql

"""What the focused tests of the lanes' parts share: a real SQLite store opener that keeps
what it opened, and events as a lane is handed them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from keylane.routing.contract.events import Event, parse_changes
from keylane.workers.stores import open_store
from keylane.workers.stores.sql import SqlStore
from keylane.workers.stores.sqlite import SqliteDialect


class SqliteOpener:
    """A store factory over one migrated SQLite file: opens the real store each call and
    keeps every store it opened, and every SQL statement they ran (``statements``)."""

    def __init__(self, path: Path) -> None:
        self.url = f"sqlite:///{path}"
        self.stores: list[SqlStore] = []
        self.statements: list[str] = []
        store = open_store(self.url)
        store.migrate()
        store.close()

    def __call__(self) -> SqlStore:
        store = open_store(self.url)
        connection = cast(SqliteDialect, store.dialect)._conn
        trace: Callable[[str], None] = self.statements.append
        connection.set_trace_callback(trace)
        self.stores.append(store)
        return store

    def transactions(self) -> int:
        """How many write transactions the opened stores began."""
        return sum(1 for s in self.statements if s.strip().upper() == "BEGIN IMMEDIATE")


def lane_event(event_id: str, record_key: str, shard: int = 2, **changes: Any) -> Event:
    """An accepted event of source ``crm``, as its lane reads it from the queue (its
    changes in wire form; ``visits`` +1 when none are given)."""
    return Event(
        source="crm",
        event_id=event_id,
        event_type="contact.updated",
        record_key=record_key,
        changes=parse_changes(changes or {"visits": {"increment": 1}}),
        body_sha256="0" * 64,
        accepted_at=1_700_000_000.0,
        shard=shard,
    )

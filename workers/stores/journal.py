"""The applied-events journal: what happened to each sender event id, closed in the
same transaction as the event's effect."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ...routing.contract.errors import AlreadyApplied
from ..store import Fence, JournalEntry, JournalOutcome
from .dialect import Cursor

_SELECT = (
    "SELECT source, event_id, record_key, shard, outcome, revision, attempts, "
    "recorded_at, fence FROM journal"
)


def _entry(row: Sequence[Any]) -> JournalEntry:
    return JournalEntry(
        row[0], row[1], row[2], int(row[3]), row[4], row[5], int(row[6]), float(row[7]), row[8]
    )


def find_entry(cur: Cursor, source: str, event_id: str) -> JournalEntry | None:
    """What happened to an event id, if anything."""
    cur.execute(_SELECT + " WHERE source = ? AND event_id = ?", (source, event_id))
    row = cur.fetchone()
    return _entry(row) if row else None


def list_entries(cur: Cursor, record_key: str | None) -> list[JournalEntry]:
    """Journal entries (of one record, or all), by record key then revision."""
    sql = _SELECT
    params: tuple[Any, ...] = ()
    if record_key is not None:
        sql += " WHERE record_key = ?"
        params = (record_key,)
    cur.execute(sql + " ORDER BY record_key, COALESCE(revision, 0), recorded_at", params)
    return [_entry(r) for r in cur.fetchall()]


def count_entries(cur: Cursor) -> int:
    """How many event ids the journal holds."""
    cur.execute("SELECT COUNT(*) FROM journal")
    return int(cur.fetchone()[0])


def record_outcome(
    cur: Cursor,
    *,
    source: str,
    event_id: str,
    record_key: str,
    shard: int,
    outcome: JournalOutcome,
    attempts: int,
    fence: Fence | None,
    reopen: bool,
    revision: int | None = None,
) -> None:
    """Journal the event's outcome, or raise :class:`AlreadyApplied`.

    ``reopen`` is an operator's retry of a dead-lettered event: its journal entry
    exists with outcome ``dead_lettered`` and may be closed once more, once.
    """
    now = time.time()
    token = fence.token if fence else None
    if reopen:
        cur.execute(
            "UPDATE journal SET outcome = ?, revision = ?, attempts = ?, fence = ?, "
            "recorded_at = ? WHERE source = ? AND event_id = ? "
            "AND outcome = 'dead_lettered'",
            (outcome, revision, attempts, token, now, source, event_id),
        )
        if cur.rowcount == 1:
            return
    cur.execute(
        "INSERT INTO journal (source, event_id, record_key, shard, outcome, revision, "
        "attempts, recorded_at, fence) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (source, event_id) DO NOTHING",
        (source, event_id, record_key, shard, outcome, revision, attempts, now, token),
    )
    if cur.rowcount == 1:
        return
    existing = find_entry(cur, source, event_id)
    raise AlreadyApplied(source, event_id, existing.outcome if existing else "recorded")

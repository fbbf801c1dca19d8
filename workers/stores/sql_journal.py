"""The applied-events journal: what happened to each sender event id, closed in the
same transaction as the event's effect.

A row the prune has archived leaves its id's 64-bit hash in ``archived_ids``. A delivery
of that id is then still refused (:class:`AlreadyApplied`, outcome ``archived``): the
check runs right after the journal insert, in the same transaction, so an archiving that
commits while the insert waits on the row it deletes is seen by the check (PostgreSQL's
read committed takes a new snapshot per statement; SQLite has one writer at a time).
Two different ids with one hash would make the second look archived: with 64 bits and
30 million ids remembered, about one new event in 600 billion; each recognition is
logged by the lane as a duplicate, and ``keylane journal find`` shows the archived row.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from typing import Any

from ...routing.contract.errors import AlreadyApplied
from ..store_rows import ARCHIVED, Fence, JournalEntry, JournalOutcome
from .dialect import Cursor, dump_json

JOURNAL_COLUMNS = (
    "source, event_id, record_key, shard, outcome, revision, attempts, recorded_at, fence, "
    "result, via, delivery"
)
_SELECT = f"SELECT {JOURNAL_COLUMNS} FROM journal"


def entry_of(row: Sequence[Any]) -> JournalEntry:
    """A journal entry from a row of :data:`JOURNAL_COLUMNS`."""
    result = json.loads(row[9]) if row[9] is not None else None
    return JournalEntry(
        row[0],
        row[1],
        row[2],
        int(row[3]),
        row[4],
        row[5],
        int(row[6]),
        float(row[7]),
        row[8],
        result,
        row[10],
        row[11],
    )


def find_entry(cur: Cursor, source: str, event_id: str) -> JournalEntry | None:
    """What happened to an event id, if anything: its row, or (once the row is archived)
    an entry with outcome ``archived`` and no record."""
    cur.execute(_SELECT + " WHERE source = ? AND event_id = ?", (source, event_id))
    row = cur.fetchone()
    if row:
        return entry_of(row)
    at = archived_at(cur, source, event_id)
    if at is None:
        return None
    return JournalEntry(source, event_id, "", -1, ARCHIVED, None, 0, at)


def id_hash(source: str, event_id: str) -> int:
    """The 64-bit hash (signed, as SQL integers are) an archived event id is kept as."""
    digest = hashlib.blake2b(f"{source}\x00{event_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def archived_at(cur: Cursor, source: str, event_id: str) -> float | None:
    """When the archived event ``(source, event_id)`` was recorded, if its id is still
    remembered."""
    cur.execute(
        "SELECT recorded_at FROM archived_ids WHERE id_hash = ?", (id_hash(source, event_id),)
    )
    row = cur.fetchone()
    return float(row[0]) if row else None


def list_entries(cur: Cursor, record_key: str | None) -> list[JournalEntry]:
    """Journal entries (of one record, or all), by record key then revision."""
    sql = _SELECT
    params: tuple[Any, ...] = ()
    if record_key is not None:
        sql += " WHERE record_key = ?"
        params = (record_key,)
    cur.execute(sql + " ORDER BY record_key, COALESCE(revision, 0), recorded_at", params)
    return [entry_of(r) for r in cur.fetchall()]


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
    retry_of: int | None,
    revision: int | None = None,
    result: dict[str, Any] | None = None,
    via: str | None = None,
    delivery: str | None = None,
) -> None:
    """Journal the event's outcome, or raise :class:`AlreadyApplied`. ``via``: the key a
    forwarded event was sent to; ``delivery``: the id of the delivery it came from.

    ``retry_of``: the dead letter an operator's retry of the event is of. Its journal
    entry exists with outcome ``dead_lettered`` and may be closed once more, once, while
    that row is the event's newest and still open (or marked retried): a second copy of
    the retry, after the first failed again (a newer row) and that row was discarded, is a
    duplicate, never an effect the operator threw away.
    """
    now = time.time()
    token = fence.token if fence else None
    stored = None if result is None else dump_json(result)
    if retry_of is not None:
        cur.execute(
            "UPDATE journal SET outcome = ?, revision = ?, attempts = ?, fence = ?, "
            "recorded_at = ?, result = ? WHERE source = ? AND event_id = ? "
            "AND outcome = 'dead_lettered' AND EXISTS (SELECT 1 FROM dead_letters "
            "WHERE id = ? AND status IN ('open', 'retried') AND id = (SELECT MAX(id) "
            "FROM dead_letters WHERE source = ? AND event_id = ? AND reason <> 'id_reused'))",
            (
                *(outcome, revision, attempts, token, now, stored),
                *(source, event_id, retry_of, source, event_id),
            ),
        )
        if cur.rowcount == 1:
            return
    row = (source, event_id, record_key, shard, outcome, revision, attempts, now, token, stored)
    cur.execute(
        "INSERT INTO journal (source, event_id, record_key, shard, outcome, revision, "
        "attempts, recorded_at, fence, result, via, delivery) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (source, event_id) DO NOTHING",
        (*row, via, delivery),
    )
    if cur.rowcount == 1:
        if archived_at(cur, source, event_id) is None:
            return
        raise AlreadyApplied(source, event_id, ARCHIVED)
    existing = find_entry(cur, source, event_id)
    raise AlreadyApplied(source, event_id, existing.outcome if existing else "recorded")

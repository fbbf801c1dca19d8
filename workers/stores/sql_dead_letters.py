"""Dead-letter review rows: write one, read, filter, move through their lifecycle, count."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from ..store_rows import DeadLetter, DeadLetterDraft, DeadLetterFilter, DeadLetterStatus
from .dialect import Cursor, Dialect, dump_json

_COLUMNS = (
    "id, created_at, source, event_id, record_key, shard, reason, {event}, {change}, "
    "revision_read, revision_found, attempts, error, status, status_by, status_at, note, retry_of"
)


def insert_dead_letter(d: Dialect, cur: Cursor, draft: DeadLetterDraft) -> int:
    """Store an open review row; return its id."""
    cur.execute(
        "INSERT INTO dead_letters (created_at, source, event_id, record_key, shard, "
        "reason, event, attempted_change, revision_read, revision_found, attempts, "
        "error, status, retry_of) VALUES (?, ?, ?, ?, ?, ?, "
        f"{d.json_param}, {d.json_param}, ?, ?, ?, ?, 'open', ?) RETURNING id",
        (
            time.time(),
            draft.source,
            draft.event_id,
            draft.record_key,
            draft.shard,
            draft.reason,
            dump_json(draft.event),
            dump_json(draft.attempted_change),
            draft.revision_read,
            draft.revision_found,
            draft.attempts,
            draft.error,
            draft.retry_of,
        ),
    )
    return int(cur.fetchone()[0])


def find_dead_letter(d: Dialect, cur: Cursor, dead_letter_id: int) -> DeadLetter | None:
    """One review row."""
    cur.execute(_select(d) + " WHERE id = ?", (dead_letter_id,))
    row = cur.fetchone()
    return dead_letter_of(row) if row else None


def list_dead_letters(d: Dialect, cur: Cursor, flt: DeadLetterFilter) -> list[DeadLetter]:
    """Review rows matching ``flt``, oldest first."""
    where, params = _where(flt, time.time())
    sql = _select(d) + where + " ORDER BY id"
    if flt.limit is not None:
        sql += " LIMIT ?"
        params.append(flt.limit)
    cur.execute(sql, params)
    return [dead_letter_of(r) for r in cur.fetchall()]


def move_dead_letter(
    cur: Cursor,
    dead_letter_id: int,
    to: DeadLetterStatus,
    allowed_from: tuple[str, ...],
    by: str,
    note: str | None,
) -> bool:
    """Move a row to ``to`` if its status is one of ``allowed_from`` (not empty)."""
    marks = ", ".join("?" for _ in allowed_from)
    cur.execute(
        "UPDATE dead_letters SET status = ?, status_by = ?, status_at = ?, "
        f"note = COALESCE(?, note) WHERE id = ? AND status IN ({marks})",
        (to, by, time.time(), note, dead_letter_id, *allowed_from),
    )
    return cur.rowcount == 1


def count_dead_letters(cur: Cursor) -> list[dict[str, Any]]:
    """Counts by status, reason and source, with the oldest row's time."""
    cur.execute(
        "SELECT status, reason, source, COUNT(*), MIN(created_at) FROM dead_letters "
        "GROUP BY status, reason, source ORDER BY status, reason, source"
    )
    return [
        {
            "status": r[0],
            "reason": r[1],
            "source": r[2],
            "count": int(r[3]),
            "oldest": float(r[4]),
        }
        for r in cur.fetchall()
    ]


def dead_letter_columns(d: Dialect) -> str:
    """The columns of a review row, in :func:`dead_letter_of`'s order, JSON as text."""
    return _COLUMNS.format(event=d.json_out("event"), change=d.json_out("attempted_change"))


def _select(d: Dialect) -> str:
    return f"SELECT {dead_letter_columns(d)} FROM dead_letters"


def dead_letter_of(row: Sequence[Any]) -> DeadLetter:
    """A review row from a row of :func:`dead_letter_columns`."""
    return DeadLetter(
        id=int(row[0]),
        created_at=float(row[1]),
        source=row[2],
        event_id=row[3],
        record_key=row[4],
        shard=int(row[5]),
        reason=row[6],
        event=json.loads(row[7]),
        attempted_change=json.loads(row[8]),
        revision_read=row[9],
        revision_found=row[10],
        attempts=int(row[11]),
        error=row[12],
        status=row[13],
        status_by=row[14],
        status_at=row[15],
        note=row[16],
        retry_of=row[17],
    )


def _where(flt: DeadLetterFilter, now: float) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []

    def any_of(column: str, values: tuple[Any, ...]) -> None:
        if values:
            clauses.append(f"{column} IN ({', '.join('?' for _ in values)})")
            params.extend(values)

    any_of("status", flt.statuses)
    any_of("reason", flt.reasons)
    any_of("source", flt.sources)
    any_of("id", flt.ids)
    if flt.after_id is not None:
        clauses.append("id > ?")
        params.append(flt.after_id)
    if flt.record_key is not None:
        clauses.append("record_key = ?")
        params.append(flt.record_key)
    if flt.older_than_s is not None:
        clauses.append("created_at <= ?")
        params.append(now - flt.older_than_s)
    if flt.newer_than_s is not None:
        clauses.append("created_at >= ?")
        params.append(now - flt.newer_than_s)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params

"""Parked messages: a record's waiting messages kept in the store instead of the broker,
for brokers that must not hold a delivery for long (RabbitMQ's consumer timeout). Every
write is fenced like a record's: only the shard's current consumer parks and unparks."""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence

from ..store import Parked
from .dialect import Cursor


def park_messages(
    cur: Cursor, shard: int, record_key: str, messages: Sequence[tuple[bytes, int]], due_at: float
) -> None:
    """Append ``messages`` (bytes, deliveries so far) to the record's parked ones, in
    order, and make the record due at ``due_at``."""
    cur.execute(
        "SELECT MAX(seq) FROM parked WHERE shard = ? AND record_key = ?", (shard, record_key)
    )
    row = cur.fetchone()
    last = int(row[0]) if row and row[0] is not None else 0
    now = time.time()
    for n, (raw, deliveries) in enumerate(messages, start=last + 1):
        cur.execute(
            "INSERT INTO parked (shard, record_key, seq, message, deliveries, due_at, parked_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (shard, record_key, n, base64.b64encode(raw).decode(), deliveries, due_at, now),
        )
    set_due(cur, shard, record_key, due_at)


def set_due(cur: Cursor, shard: int, record_key: str, due_at: float) -> None:
    """When the record's parked messages are due."""
    cur.execute(
        "UPDATE parked SET due_at = ? WHERE shard = ? AND record_key = ?",
        (due_at, shard, record_key),
    )


def count_delivery(cur: Cursor, shard: int, record_key: str, seq: int, by: int) -> None:
    """One more (or, ``by`` -1, one less) delivery of a parked message."""
    cur.execute(
        "UPDATE parked SET deliveries = deliveries + ? "
        "WHERE shard = ? AND record_key = ? AND seq = ?",
        (by, shard, record_key, seq),
    )


def parked_rows(
    cur: Cursor, shard: int, record_key: str | None = None, limit: int | None = None
) -> list[Parked]:
    """The shard's parked messages (one record's, if given; the first ``limit``), in
    order."""
    sql = "SELECT record_key, seq, message, deliveries, due_at FROM parked WHERE shard = ?"
    params: tuple[object, ...] = (shard,)
    if record_key is not None:
        sql += " AND record_key = ?"
        params = (shard, record_key)
    sql += " ORDER BY record_key, seq"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    cur.execute(sql, params)
    return [
        Parked(str(key), int(seq), base64.b64decode(message), int(deliveries), float(due_at))
        for key, seq, message, deliveries, due_at in cur.fetchall()
    ]


def unpark_messages(cur: Cursor, shard: int, record_key: str, seqs: Sequence[int]) -> int:
    """Delete the record's parked messages ``seqs``; how many of its messages remain."""
    for seq in seqs:
        cur.execute(
            "DELETE FROM parked WHERE shard = ? AND record_key = ? AND seq = ?",
            (shard, record_key, seq),
        )
    cur.execute(
        "SELECT COUNT(*) FROM parked WHERE shard = ? AND record_key = ?", (shard, record_key)
    )
    row = cur.fetchone()
    return int(row[0]) if row else 0

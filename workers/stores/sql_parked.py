"""Parked messages: a record's waiting messages kept in the store instead of the broker,
for brokers that must not hold a delivery for long (RabbitMQ's consumer timeout). Every
write is fenced like a record's: only the shard's current consumer parks and unparks."""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence

from ..store_rows import Parked
from .dialect import Cursor, Dialect


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
    return count_messages(cur, shard, record_key)


def count_messages(cur: Cursor, shard: int, record_key: str) -> int:
    """How many messages of the record are parked."""
    cur.execute(
        "SELECT COUNT(*) FROM parked WHERE shard = ? AND record_key = ?", (shard, record_key)
    )
    row = cur.fetchone()
    return int(row[0]) if row else 0


def hold_record(
    d: Dialect, cur: Cursor, shard: int, record_key: str, dead_letter_id: int, now: float
) -> int | None:
    """Hold the record behind ``dead_letter_id`` unless something holds it already or the
    row is no longer open (closed by an operator before the hold came: holding then would
    hold the record for good); the dead letter that holds it now.

    The row is read with a share lock (PostgreSQL): an operator's close that comes while
    this transaction is open waits for it, then finds the hold and sends the release;
    one that came first is seen here, and nothing is held."""
    cur.execute(
        f"SELECT 1 FROM dead_letters WHERE id = ? AND status IN ('open', 'retried'){d.fence_lock}",
        (dead_letter_id,),
    )
    if cur.fetchone() is not None:
        cur.execute(
            "INSERT INTO held (shard, record_key, dead_letter_id, held_at) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (shard, record_key) DO NOTHING",
            (shard, record_key, dead_letter_id, now),
        )
    return held_records(cur, shard, record_key).get(record_key)


def held_records(cur: Cursor, shard: int, record_key: str | None = None) -> dict[str, int]:
    """The shard's held records (``record_key`` only, if given) -> the dead letter that
    holds each."""
    sql = "SELECT record_key, dead_letter_id FROM held WHERE shard = ?"
    params: tuple[object, ...] = (shard,)
    if record_key is not None:
        sql += " AND record_key = ?"
        params = (shard, record_key)
    cur.execute(sql, params)
    return {str(key): int(row_id) for key, row_id in cur.fetchall()}


def release_record(
    cur: Cursor,
    shard: int,
    record_key: str,
    dead_letter_id: int,
    due_at: float,
    first: tuple[bytes, int] | None,
) -> bool:
    """Release the record if ``dead_letter_id`` holds it: its parked messages are due at
    ``due_at``, behind ``first`` (the operator's retry of that row) if given. Whether it
    was released."""
    cur.execute(
        "DELETE FROM held WHERE shard = ? AND record_key = ? AND dead_letter_id = ?",
        (shard, record_key, dead_letter_id),
    )
    if cur.rowcount != 1:
        return False
    if first is not None:
        # Ahead of the parked messages: every seq moves up by one (in two steps, so no
        # row meets another's key on the way), and the retry takes seq 1.
        cur.execute(
            "UPDATE parked SET seq = -seq - 1 WHERE shard = ? AND record_key = ?",
            (shard, record_key),
        )
        cur.execute(
            "UPDATE parked SET seq = -seq WHERE shard = ? AND record_key = ?",
            (shard, record_key),
        )
        raw, deliveries = first
        cur.execute(
            "INSERT INTO parked (shard, record_key, seq, message, deliveries, due_at, parked_at) "
            "VALUES (?, ?, 1, ?, ?, ?, ?)",
            (shard, record_key, base64.b64encode(raw).decode(), deliveries, due_at, time.time()),
        )
    set_due(cur, shard, record_key, due_at)
    return True

"""Tries of redelivered messages: how many times a lane started a message the broker had
handed out before, for brokers whose own delivery count also counts deliveries no lane
tried (RabbitMQ: every delivery a lost connection takes back, prefetched or not).

A row is written before its try starts, so a try that kills its worker is counted; a
message's first delivery writes none (nothing is known of an earlier one). Rows leave when
their message is acknowledged, parked (the parked row carries the count on) or
dead-lettered by the broker past its own limit (a review row then), and any row
older than :data:`TRIES_KEPT_S` is deleted by the next note: a crash between the note and
its removal leaves one, and nothing else reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

from .dialect import Cursor

#: How long a note outlives its last try at most. A message still in its queue after
#: that counts only the deliveries since (the broker's own delivery limit still ends it).
TRIES_KEPT_S = 7 * 24 * 3600


def note_try(cur: Cursor, shard: int, digest: str, now: float) -> int:
    """One more try of the shard's message ``digest``; its tries noted so far, this one
    included. Notes past :data:`TRIES_KEPT_S` leave first."""
    cur.execute("DELETE FROM tries WHERE tried_at < ?", (now - TRIES_KEPT_S,))
    cur.execute(
        "INSERT INTO tries (shard, digest, tries, tried_at) VALUES (?, ?, 1, ?) "
        "ON CONFLICT (shard, digest) DO UPDATE SET tries = tries.tries + 1, "
        "tried_at = excluded.tried_at RETURNING tries",
        (shard, digest, now),
    )
    row = cur.fetchone()
    return int(row[0]) if row else 1


def noted_tries(cur: Cursor, shard: int, digests: Sequence[str]) -> dict[str, int]:
    """The tries noted of the shard's messages ``digests`` (absent: none)."""
    if not digests:
        return {}
    marks = ", ".join("?" for _ in digests)
    cur.execute(
        f"SELECT digest, tries FROM tries WHERE shard = ? AND digest IN ({marks})",
        (shard, *digests),
    )
    return {str(digest): int(tries) for digest, tries in cur.fetchall()}


def forget_tries(cur: Cursor, shard: int, digests: Sequence[str]) -> None:
    """The shard's messages ``digests`` are done with (acknowledged or parked)."""
    for digest in digests:
        cur.execute("DELETE FROM tries WHERE shard = ? AND digest = ?", (shard, digest))

"""Shard fences: the newest fencing token per shard, checked inside each write."""

from __future__ import annotations

import time

from ...routing.contract.errors import StaleFence
from ..store_rows import Fence
from .dialect import Cursor, Dialect


def stored_token(cur: Cursor, shard: int, lock: str = "") -> int:
    """The shard's newest fencing token (0 if none), its row locked by ``lock``."""
    cur.execute("SELECT token FROM shard_fences WHERE shard = ?" + lock, (shard,))
    row = cur.fetchone()
    return int(row[0]) if row else 0


def stored_tokens(cur: Cursor) -> dict[int, int]:
    """Every shard's newest fencing token (shards never fenced are absent)."""
    cur.execute("SELECT shard, token FROM shard_fences")
    return {int(shard): int(token) for shard, token in cur.fetchall()}


def lock_fence(d: Dialect, cur: Cursor, shard: int) -> int:
    """Read (and lock against advances) the shard's newest fencing token; 0 if none."""
    return stored_token(cur, shard, d.fence_lock)


def check_fence(d: Dialect, cur: Cursor, fence: Fence | None) -> None:
    """Raise :class:`StaleFence` if the store has seen a newer token for the shard."""
    if fence is None:
        return
    current = lock_fence(d, cur, fence.shard)
    if current > fence.token:
        raise StaleFence(fence.shard, fence.token, current)
    if current < fence.token:
        # No row yet, or an older token: record ours, then look again. A concurrent
        # advance by a newer owner commits first or waits for us; either way the
        # second read sees the newest token (PostgreSQL: FOR SHARE finds nothing to
        # lock while the row does not exist, so the first read alone is not enough).
        upsert_fence(cur, fence.shard, fence.token)
        current = lock_fence(d, cur, fence.shard)
        if current > fence.token:
            raise StaleFence(fence.shard, fence.token, current)


def upsert_fence(cur: Cursor, shard: int, token: int) -> None:
    """Record ``token`` as the shard's newest if it is newer than the one stored."""
    cur.execute(
        "INSERT INTO shard_fences (shard, token, updated_at) VALUES (?, ?, ?) "
        "ON CONFLICT (shard) DO UPDATE SET token = excluded.token, "
        "updated_at = excluded.updated_at WHERE shard_fences.token < excluded.token",
        (shard, token, time.time()),
    )


def claim_next_token(cur: Cursor, shard: int) -> int:
    """Advance the shard's token by one and return it. The increment is one ``UPDATE``
    (it locks the row): two concurrent claims get two tokens, and a write holding the row
    ``FOR SHARE`` with an older token finishes before it or is refused after it."""
    upsert_fence(cur, shard, 0)  # the row, if there was none
    cur.execute(
        "UPDATE shard_fences SET token = token + 1, updated_at = ? WHERE shard = ?",
        (time.time(), shard),
    )
    return stored_token(cur, shard)

"""The identity index (identity -> record) and the pairs of records kept apart."""

from __future__ import annotations

import time
from collections.abc import Sequence

from .dialect import Cursor


def claim_identities(cur: Cursor, record_key: str, identities: Sequence[str]) -> None:
    """Name ``record_key`` by each of ``identities`` that names no record yet (one that
    names another record stays as it is: the lane proposes a merge of the two), in one
    statement."""
    now = time.time()
    rows = ", ".join("(?, ?, ?)" for _ in identities)
    cur.execute(
        f"INSERT INTO identities (identity, record_key, claimed_at) VALUES {rows} "
        "ON CONFLICT (identity) DO NOTHING",
        tuple(value for identity in identities for value in (identity, record_key, now)),
    )


def move_identities(cur: Cursor, absorbed: str, survivor: str) -> int:
    """Every identity of ``absorbed`` now names ``survivor``; how many."""
    cur.execute("UPDATE identities SET record_key = ? WHERE record_key = ?", (survivor, absorbed))
    return max(0, int(cur.rowcount))


def return_identities(cur: Cursor, survivor: str, reopened: str, identities: Sequence[str]) -> None:
    """Those of ``identities`` that name ``survivor`` name ``reopened`` again, in one
    statement."""
    if not identities:
        return
    marks = ", ".join("?" for _ in identities)
    cur.execute(
        f"UPDATE identities SET record_key = ? WHERE record_key = ? AND identity IN ({marks})",
        (reopened, survivor, *identities),
    )


def owners(cur: Cursor, identities: Sequence[str]) -> dict[str, str]:
    """The record each of ``identities`` names (those the index has), in one query."""
    if not identities:
        return {}
    marks = ", ".join("?" for _ in identities)
    cur.execute(
        f"SELECT identity, record_key FROM identities WHERE identity IN ({marks})",
        tuple(identities),
    )
    return {str(row[0]): str(row[1]) for row in cur.fetchall()}


def identities_of(cur: Cursor, record_key: str) -> list[str]:
    """The identities that name ``record_key``, in order."""
    cur.execute(
        "SELECT identity FROM identities WHERE record_key = ? ORDER BY identity", (record_key,)
    )
    return [str(row[0]) for row in cur.fetchall()]


def is_kept_apart(cur: Cursor, a: str, b: str) -> bool:
    """Whether a person said ``a`` and ``b`` are two records."""
    low, high = sorted((a, b))
    cur.execute("SELECT 1 FROM kept_apart WHERE a = ? AND b = ?", (low, high))
    return cur.fetchone() is not None


def keep_apart(cur: Cursor, a: str, b: str, by: str) -> None:
    """Remember that ``a`` and ``b`` are two records (again: nothing more)."""
    low, high = sorted((a, b))
    cur.execute(
        "INSERT INTO kept_apart (a, b, kept_by, kept_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (a, b) DO NOTHING",
        (low, high, by, time.time()),
    )

"""The destination the Celery baselines write: one table of records, in a SQLite file or a
PostgreSQL schema of the benchmark's own, written the way a task usually writes it.

``read_sleep_write`` reads the record, waits the destination's latency, and writes the
new ``total`` and ``seqs`` computed from what it read, with no check that the row is
still as read: the last writer wins. keylane writes the same two fields in its own store,
computed the same way by a source handler (:mod:`keylane.ops.bench.versus_handler`), but
conditionally on the revision it read.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import psycopg

TABLE = "versus_records"
_CREATE = f"CREATE TABLE IF NOT EXISTS {TABLE} (key TEXT PRIMARY KEY, total BIGINT NOT NULL, seqs TEXT NOT NULL)"  # noqa: E501
_READ = f"SELECT total, seqs FROM {TABLE} WHERE key = ?"  # noqa: S608
_WRITE = (
    f"INSERT INTO {TABLE} (key, total, seqs) VALUES (?, ?, ?) "  # noqa: S608
    "ON CONFLICT (key) DO UPDATE SET total = excluded.total, seqs = excluded.seqs"
)
_READ_PREFIX = f"SELECT key, total, seqs FROM {TABLE} WHERE key LIKE ?"  # noqa: S608


class Table:
    """One connection to the destination table (a SQLite file or PostgreSQL), autocommit."""

    def __init__(self, url: str) -> None:
        self._pg = url.startswith("postgresql")
        self._conn: Any
        if self._pg:
            self._conn = psycopg.connect(url, autocommit=True)
        else:
            path = url.removeprefix("sqlite:///")
            self._conn = sqlite3.connect(path, isolation_level=None, timeout=60)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA busy_timeout=60000")

    def _sql(self, text: str) -> str:
        return text.replace("?", "%s") if self._pg else text

    def create(self) -> None:
        """Create the table if it is not there."""
        self._conn.execute(_CREATE)

    def read(self, key: str) -> tuple[int, list[int]]:
        """The record's total and sequence numbers (0 and none when it is absent)."""
        row = self._conn.execute(self._sql(_READ), (key,)).fetchone()
        return (0, []) if row is None else (int(row[0]), parse_seqs(row[1]))

    def write(self, key: str, total: int, seqs: list[int]) -> None:
        """Replace the record, whatever it holds now."""
        self._conn.execute(self._sql(_WRITE), (key, total, ",".join(map(str, seqs))))

    def read_prefix(self, prefix: str) -> dict[str, tuple[int, list[int]]]:
        """Every record whose key starts with ``prefix``."""
        rows = self._conn.execute(self._sql(_READ_PREFIX), (prefix + "%",)).fetchall()
        return {str(key): (int(total), parse_seqs(seqs)) for key, total, seqs in rows}

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


def parse_seqs(text: str) -> list[int]:
    """``"3,7,9"`` -> ``[3, 7, 9]``."""
    return [int(s) for s in text.split(",") if s]


def read_sleep_write(table: Table, key: str, seq: int, amount: int, latency_s: float) -> None:
    """One event's effect as a task usually applies it: read, wait, write what it computed."""
    total, seqs = table.read(key)
    time.sleep(latency_s)
    table.write(key, total + amount, [*seqs, seq])

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

#: The statements, for a table named ``{table}`` (one per Celery baseline, so they can
#: use the same record keys); SQLite's placeholders, turned into psycopg's for PostgreSQL.
_CREATE = (
    "CREATE TABLE IF NOT EXISTS {table} "
    "(key TEXT PRIMARY KEY, total BIGINT NOT NULL, seqs TEXT NOT NULL)"
)
_READ = "SELECT total, seqs FROM {table} WHERE key = ?"
_WRITE = (
    "INSERT INTO {table} (key, total, seqs) VALUES (?, ?, ?) "
    "ON CONFLICT (key) DO UPDATE SET total = excluded.total, seqs = excluded.seqs"
)
_READ_PREFIX = "SELECT key, total, seqs FROM {table} WHERE key LIKE ?"


def table_name(system: str) -> str:
    """The table ``system`` writes (``celery-lock`` -> ``versus_celery_lock``)."""
    return "versus_" + "".join(c if c.isalnum() else "_" for c in system)


class Table:
    """One connection to a destination table (a SQLite file or PostgreSQL), autocommit."""

    def __init__(self, url: str, name: str) -> None:
        self._name = name
        self._pg = url.startswith("postgresql")
        self._conn: Any
        if self._pg:
            self._conn = psycopg.connect(url, autocommit=True)
        else:
            path = url.removeprefix("sqlite:///")
            self._conn = sqlite3.connect(path, isolation_level=None, timeout=60)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA busy_timeout=60000")

    def _sql(self, template: str) -> str:
        text = template.format(table=self._name)
        return text.replace("?", "%s") if self._pg else text

    def create(self) -> None:
        """Create the table if it is not there."""
        self._conn.execute(self._sql(_CREATE))

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

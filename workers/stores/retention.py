"""What the prune reads from the store's tables and removes from them once archived.

Every row leaves in two steps (see ``ops/retention.py``): the prune reads old rows here
(outside any write transaction: a read never blocks the lanes), writes them to a complete
archive file, and only then deletes them here, in one short transaction per batch. The
delete names each row with the version it was archived at (a journal row's
``recorded_at``, a review row's ``status_at``), so a row that changed in between stays
in the table, and a delete run twice deletes nothing the second time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

from .base import ArchiveRow, JournalEntry, PrunedTable, TableAge
from .dead_letters import dead_letter_columns, dead_letter_of
from .dialect import Cursor, Dialect
from .journal import JOURNAL_COLUMNS, entry_of, id_hash

#: Rows per statement inside one delete transaction (SQLite takes at most 32,766
#: parameters in one statement).
STATEMENT_ROWS = 2000
CLOSED = ("retried", "discarded", "resolved")
_CLOSED_SQL = "('retried', 'discarded', 'resolved')"

# A dead-lettered event keeps its journal row while a person may still retry it: its
# review row is open, or was closed after the cutoff.
_JOURNAL_DUE = (
    "FROM journal j WHERE j.source = ? AND j.recorded_at < ? "
    "AND (j.outcome <> 'dead_lettered' OR NOT EXISTS (SELECT 1 FROM dead_letters d "
    "WHERE d.source = j.source AND d.event_id = j.event_id "
    "AND (d.status = 'open' OR d.status_at IS NULL OR d.status_at >= ?)))"
)
_DEAD_LETTERS_DUE = f"FROM dead_letters WHERE status IN {_CLOSED_SQL} AND status_at < ?"


def journal_sources(cur: Cursor) -> list[str]:
    """The distinct sources of the journal, read by skipping along the primary key (one
    index probe per source, not a scan of every row)."""
    cur.execute(
        "WITH RECURSIVE s(source) AS (SELECT MIN(source) FROM journal UNION ALL "
        "SELECT (SELECT MIN(source) FROM journal WHERE source > s.source) FROM s "
        "WHERE s.source IS NOT NULL) SELECT source FROM s WHERE source IS NOT NULL"
    )
    return [str(r[0]) for r in cur.fetchall()]


def old_rows(
    d: Dialect, cur: Cursor, table: PrunedTable, before: float, limit: int, source: str
) -> list[ArchiveRow]:
    """Rows of ``table`` due for the archive (see :meth:`Store.old_rows`), oldest first."""
    if table == "journal":
        cur.execute(
            f"SELECT {JOURNAL_COLUMNS} {_JOURNAL_DUE} ORDER BY j.recorded_at LIMIT ?",
            (source, before, before, limit),
        )
        return [_journal_row(r) for r in cur.fetchall()]
    cur.execute(
        f"SELECT {dead_letter_columns(d)} {_DEAD_LETTERS_DUE} ORDER BY id LIMIT ?",
        (before, limit),
    )
    return [asdict(dead_letter_of(r)) for r in cur.fetchall()]


def count_old_rows(cur: Cursor, table: PrunedTable, before: float, source: str) -> int:
    """How many rows :func:`old_rows` would give without a limit."""
    if table == "journal":
        cur.execute(f"SELECT COUNT(*) {_JOURNAL_DUE}", (source, before, before))
    else:
        cur.execute(f"SELECT COUNT(*) {_DEAD_LETTERS_DUE}", (before,))
    return int(cur.fetchone()[0])


def remove_archived(
    cur: Cursor, table: PrunedTable, rows: Sequence[ArchiveRow]
) -> list[ArchiveRow]:
    """Delete the archived ``rows`` that are unchanged (see :meth:`Store.remove_archived`);
    the rows now in the archive alone."""
    columns: tuple[str, ...] = ("source", "event_id") if table == "journal" else ("id",)
    key_of = _journal_key if table == "journal" else _dead_letter_key
    version = "recorded_at" if table == "journal" else "status_at"
    deleted: set[tuple[Any, ...]] = set()
    for chunk in _chunks(rows):
        deleted.update(_delete(cur, table, columns, version, chunk, key_of))
    missed = [r for r in rows if key_of(r) not in deleted]
    present: set[tuple[Any, ...]] = set()
    for chunk in _chunks(missed):
        present.update(_present(cur, table, columns, chunk, key_of))
    if table == "journal":
        for chunk in _chunks([r for r in rows if key_of(r) in deleted]):
            _remember_ids(cur, chunk)
    return [r for r in rows if key_of(r) not in present]


def forget_archived_ids(cur: Cursor, before: float, limit: int) -> int:
    """Forget up to ``limit`` archived ids recorded before ``before`` (kept to the second:
    those of the second ``before`` falls in go too)."""
    cur.execute(
        "DELETE FROM archived_ids WHERE id_hash IN (SELECT id_hash FROM archived_ids "
        "WHERE recorded_at < ? ORDER BY recorded_at LIMIT ?)",
        (math.ceil(before), limit),
    )
    return max(0, cur.rowcount)


def table_ages(cur: Cursor) -> dict[str, TableAge]:
    """Rows and oldest row of the journal, the closed review rows and the archived ids."""
    cur.execute("SELECT COUNT(*) FROM journal")
    journal_rows = int(cur.fetchone()[0])
    oldest: list[float] = []
    for source in journal_sources(cur):
        cur.execute("SELECT MIN(recorded_at) FROM journal WHERE source = ?", (source,))
        oldest.append(float(cur.fetchone()[0]))
    cur.execute(f"SELECT COUNT(*), MIN(status_at) FROM dead_letters WHERE status IN {_CLOSED_SQL}")
    closed = cur.fetchone()
    cur.execute("SELECT COUNT(*), MIN(recorded_at) FROM archived_ids")
    ids = cur.fetchone()
    return {
        "journal": TableAge(journal_rows, min(oldest) if oldest else None),
        "dead_letters": TableAge(int(closed[0]), _float(closed[1])),
        "archived_ids": TableAge(int(ids[0]), _float(ids[1])),
    }


def find_journal(
    cur: Cursor, event_id: str | None, source: str | None, record_key: str | None
) -> list[JournalEntry]:
    """Journal rows in the table with this event id (of ``source``, or of any source) or
    of this record, by recorded time."""
    select = f"SELECT {JOURNAL_COLUMNS} FROM journal j"
    found: list[JournalEntry] = []
    if record_key is not None:
        cur.execute(select + " WHERE j.record_key = ?", (record_key,))
        found = [entry_of(r) for r in cur.fetchall()]
        found = [e for e in found if _matches(e, event_id, source)]
    elif event_id is not None:
        for one in [source] if source is not None else journal_sources(cur):
            cur.execute(select + " WHERE j.source = ? AND j.event_id = ?", (one, event_id))
            found += [entry_of(r) for r in cur.fetchall()]
    return sorted(found, key=lambda e: e.recorded_at)


def _matches(entry: JournalEntry, event_id: str | None, source: str | None) -> bool:
    return (event_id is None or entry.event_id == event_id) and (
        source is None or entry.source == source
    )


def _delete(
    cur: Cursor,
    table: str,
    columns: tuple[str, ...],
    version: str,
    rows: Sequence[ArchiveRow],
    key_of: Any,
) -> set[tuple[Any, ...]]:
    names = ", ".join((*columns, version))
    marks = ", ".join("?" for _ in range(len(columns) + 1))
    values = ", ".join(f"({marks})" for _ in rows)
    params = [v for r in rows for v in (*key_of(r), r[version])]
    cur.execute(
        f"DELETE FROM {table} WHERE ({names}) IN (VALUES {values}) RETURNING {', '.join(columns)}",
        params,
    )
    return {tuple(r) for r in cur.fetchall()}


def _present(
    cur: Cursor, table: str, columns: tuple[str, ...], rows: Sequence[ArchiveRow], key_of: Any
) -> set[tuple[Any, ...]]:
    marks = ", ".join("?" for _ in columns)
    values = ", ".join(f"({marks})" for _ in rows)
    names = ", ".join(columns)
    cur.execute(
        f"SELECT {names} FROM {table} WHERE ({names}) IN (VALUES {values})",
        [v for r in rows for v in key_of(r)],
    )
    return {tuple(r) for r in cur.fetchall()}


def _remember_ids(cur: Cursor, rows: Sequence[ArchiveRow]) -> None:
    values = ", ".join("(?, ?)" for _ in rows)
    params = [v for r in rows for v in (id_hash(r["source"], r["event_id"]), int(r["recorded_at"]))]
    cur.execute(
        f"INSERT INTO archived_ids (id_hash, recorded_at) VALUES {values} "
        "ON CONFLICT (id_hash) DO NOTHING",
        params,
    )


def _chunks(rows: Sequence[ArchiveRow]) -> Iterator[Sequence[ArchiveRow]]:
    for start in range(0, len(rows), STATEMENT_ROWS):
        yield rows[start : start + STATEMENT_ROWS]


def _journal_key(row: ArchiveRow) -> tuple[Any, ...]:
    return (row["source"], row["event_id"])


def _dead_letter_key(row: ArchiveRow) -> tuple[Any, ...]:
    return (row["id"],)


def _journal_row(row: Sequence[Any]) -> ArchiveRow:
    e = entry_of(row)
    return {
        "source": e.source,
        "event_id": e.event_id,
        "record_key": e.record_key,
        "shard": e.shard,
        "outcome": e.outcome,
        "revision": e.revision,
        "attempts": e.attempts,
        "recorded_at": e.recorded_at,
        "fence": e.fence,
    }


def _float(value: Any) -> float | None:
    return None if value is None else float(value)

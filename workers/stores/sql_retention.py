"""What the prune reads from the store's tables and removes from them once archived.

Every row leaves in two steps (see ``ops/retention.py``): the prune reads old rows here
(outside any write transaction: a read never blocks the lanes), writes them to a complete
archive file, and only then deletes them here, in one short transaction per batch. A row
is deleted only if it still has the version it was archived at (a journal row's
``recorded_at``, a review row's ``status_at``), so a row that changed in between stays
in the table, and a delete run twice deletes nothing the second time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

from ..store_rows import ArchiveRow, JournalEntry, PrunedTable, TableAge
from .dialect import Cursor, Dialect
from .sql_dead_letters import dead_letter_columns, dead_letter_of
from .sql_journal import JOURNAL_COLUMNS, entry_of, id_hash

#: Rows per statement inside one delete transaction (SQLite takes at most 32,766
#: parameters in one statement, PostgreSQL 65,535).
STATEMENT_ROWS = 2000
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
_DELIVERIES_DUE = "FROM deliveries WHERE source = ? AND received_at < ?"


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
    """Rows of ``table`` due for the archive (see :meth:`RetentionStore.old_rows`), oldest first."""
    if table == "journal":
        cur.execute(
            f"SELECT {JOURNAL_COLUMNS} {_JOURNAL_DUE} ORDER BY j.recorded_at LIMIT ?",
            (source, before, before, limit),
        )
        return [asdict(entry_of(r)) for r in cur.fetchall()]
    if table == "deliveries":
        cur.execute(
            f"SELECT id, source, received_at, {d.json_out('request')} {_DELIVERIES_DUE} "
            "ORDER BY received_at LIMIT ?",
            (source, before, limit),
        )
        return [_delivery_row(r) for r in cur.fetchall()]
    cur.execute(
        f"SELECT {dead_letter_columns(d)} {_DEAD_LETTERS_DUE} ORDER BY id LIMIT ?",
        (before, limit),
    )
    return [asdict(dead_letter_of(r)) for r in cur.fetchall()]


def count_old_rows(cur: Cursor, table: PrunedTable, before: float, source: str) -> int:
    """How many rows :func:`old_rows` would give without a limit."""
    if table == "journal":
        cur.execute(f"SELECT COUNT(*) {_JOURNAL_DUE}", (source, before, before))
    elif table == "deliveries":
        cur.execute(f"SELECT COUNT(*) {_DELIVERIES_DUE}", (source, before))
    else:
        cur.execute(f"SELECT COUNT(*) {_DEAD_LETTERS_DUE}", (before,))
    return int(cur.fetchone()[0])


def remove_archived(
    d: Dialect, cur: Cursor, table: PrunedTable, rows: Sequence[ArchiveRow]
) -> list[ArchiveRow]:
    """Delete the archived ``rows`` that are unchanged (see :meth:`RetentionStore.remove_archived`);
    the rows now in the archive alone.

    Each statement names rows by their primary key (a list of keys of one source: an
    index lookup per row on both databases, where a row-value ``IN`` makes SQLite scan
    the table): the rows are read first, locked on PostgreSQL, their versions compared
    here, and the unchanged ones deleted."""
    version = _VERSION[table]
    archived = {(_group(table, r), r[_ID[table]]): r[version] for r in rows}
    changed: set[Any] = set()
    for group, ids in _by_group(table, rows):
        found = _versions(d, cur, table, group, ids, version)
        unchanged = [i for i in ids if i in found and found[i] == archived[group, i]]
        changed.update((group, i) for i in ids if i in found and found[i] != archived[group, i])
        _delete(cur, table, group, unchanged)
        if table == "journal":
            _remember_ids(cur, group, [(i, archived[group, i]) for i in unchanged])
    return [r for r in rows if (_group(table, r), r[_ID[table]]) not in changed]


#: The column naming a row within its group (the journal's rows group by source).
_ID = {"journal": "event_id", "dead_letters": "id", "deliveries": "id"}
#: The column a row is archived at the version of (a kept delivery never changes).
_VERSION = {"journal": "recorded_at", "dead_letters": "status_at", "deliveries": "received_at"}


def _group(table: str, row: ArchiveRow) -> str:
    return str(row["source"]) if table in ("journal", "deliveries") else ""


def _delivery_row(row: Sequence[Any]) -> ArchiveRow:
    request = row[3] if isinstance(row[3], dict) else json.loads(row[3])
    return {"id": row[0], "source": row[1], "received_at": float(row[2]), "request": request}


def _by_group(table: str, rows: Sequence[ArchiveRow]) -> Iterator[tuple[str, list[Any]]]:
    """The rows' ids by group, in statements of at most :data:`STATEMENT_ROWS`."""
    groups: dict[str, list[Any]] = {}
    for row in rows:
        groups.setdefault(_group(table, row), []).append(row[_ID[table]])
    for group, ids in groups.items():
        for start in range(0, len(ids), STATEMENT_ROWS):
            yield group, ids[start : start + STATEMENT_ROWS]


def _where(table: str, group: str, ids: Sequence[Any]) -> tuple[str, list[Any]]:
    marks = ", ".join("?" for _ in ids)
    if table == "journal":
        return f"source = ? AND event_id IN ({marks})", [group, *ids]
    if table == "deliveries":
        return f"source = ? AND id IN ({marks})", [group, *ids]
    return f"id IN ({marks})", list(ids)


def _versions(
    d: Dialect, cur: Cursor, table: str, group: str, ids: Sequence[Any], version: str
) -> dict[Any, Any]:
    where, params = _where(table, group, ids)
    cur.execute(f"SELECT {_ID[table]}, {version} FROM {table} WHERE {where}{d.row_lock}", params)
    return {r[0]: r[1] for r in cur.fetchall()}


def _delete(cur: Cursor, table: str, group: str, ids: Sequence[Any]) -> None:
    if ids:
        where, params = _where(table, group, ids)
        cur.execute(f"DELETE FROM {table} WHERE {where}", params)


def _remember_ids(cur: Cursor, source: str, events: Sequence[tuple[str, float]]) -> None:
    """Keep the ids of ``source``'s archived events (event id, recorded at)."""
    if not events:
        return
    values = ", ".join("(?, ?)" for _ in events)
    params = [v for e, at in events for v in (id_hash(source, e), int(at))]
    cur.execute(
        f"INSERT INTO archived_ids (id_hash, recorded_at) VALUES {values} "
        "ON CONFLICT (id_hash) DO NOTHING",
        params,
    )


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
    cur.execute("SELECT COUNT(*), MIN(received_at) FROM deliveries")
    deliveries = cur.fetchone()
    return {
        "journal": TableAge(journal_rows, min(oldest) if oldest else None),
        "dead_letters": TableAge(int(closed[0]), _float(closed[1])),
        "archived_ids": TableAge(int(ids[0]), _float(ids[1])),
        "deliveries": TableAge(int(deliveries[0]), _float(deliveries[1])),
    }


def find_journal(
    cur: Cursor, event_id: str | None, source: str | None, record_key: str | None
) -> list[JournalEntry]:
    """Journal rows in the table with this event id (of ``source``, or of any source) or
    of this record (with the events forwarded from it: sent to it, applied where it was
    merged into), by recorded time."""
    select = f"SELECT {JOURNAL_COLUMNS} FROM journal j"
    found: list[JournalEntry] = []
    if record_key is not None:
        for column in ("record_key", "via"):  # two index lookups (an OR may scan)
            cur.execute(select + f" WHERE j.{column} = ?", (record_key,))
            found += [entry_of(r) for r in cur.fetchall()]
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


def _float(value: Any) -> float | None:
    return None if value is None else float(value)

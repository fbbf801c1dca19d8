"""Records: read one, write one under the revision check, list keys."""

from __future__ import annotations

import json
import time
from typing import Any

from ...routing.contract.errors import RecordMerged, VersionConflict
from ..store_rows import Record
from .dialect import Cursor, Dialect, dump_json

_COLUMNS = "key, {fields}, revision, updated_at, created_at, merged_into, kept_for"


def read_record(d: Dialect, cur: Cursor, record_key: str) -> Record:
    """The record as it is now (revision 0 and no fields when absent)."""
    cur.execute(f"SELECT {record_columns(d)} FROM records WHERE key = ?", (record_key,))
    row = cur.fetchone()
    return Record(record_key, {}, 0) if row is None else record_of(row)


def record_columns(d: Dialect) -> str:
    """The columns :func:`record_of` reads, in its order."""
    return _COLUMNS.format(fields=d.json_out("fields"))


def record_of(row: Any) -> Record:
    """A row of :func:`record_columns` as a :class:`Record`."""
    created_at = None if row[4] is None else float(row[4])
    fields = json.loads(row[1])
    return Record(str(row[0]), fields, int(row[2]), float(row[3]), created_at, row[5], row[6])


def write_record(
    d: Dialect, cur: Cursor, record_key: str, fields: dict[str, Any], expected: int
) -> int:
    """The conditional write: the revision check and the revision advance are one
    statement, so two writers that read the same revision cannot both succeed. A
    tombstone (a merged record) is never written: :class:`RecordMerged` names its
    survivor."""
    now = time.time()
    if expected == 0:
        cur.execute(
            "INSERT INTO records (key, fields, revision, updated_at, created_at) "
            f"VALUES (?, {d.json_param}, 1, ?, ?) ON CONFLICT (key) DO NOTHING "
            "RETURNING revision",
            (record_key, dump_json(fields), now, now),
        )
    else:
        cur.execute(
            f"UPDATE records SET fields = {d.json_param}, revision = revision + 1, "
            "updated_at = ? WHERE key = ? AND revision = ? AND merged_into IS NULL "
            "RETURNING revision",
            (dump_json(fields), now, record_key, expected),
        )
    row = cur.fetchone()
    if row is None:
        cur.execute("SELECT revision, merged_into FROM records WHERE key = ?", (record_key,))
        found = cur.fetchone()
        if found is not None and found[1] is not None:
            raise RecordMerged(record_key, expected, int(found[0]), str(found[1]))
        raise VersionConflict(record_key, expected, int(found[0]) if found else 0)
    return int(row[0])


def keep_key(d: Dialect, cur: Cursor, record_key: str, task: str) -> None:
    """The row of a record kept elsewhere by ``task`` (a task that merges), written once:
    no fields, revision 1, its creation time, whose it is."""
    now = time.time()
    cur.execute(
        "INSERT INTO records (key, fields, revision, updated_at, created_at, kept_for) "
        f"VALUES (?, {d.json_param}, 1, ?, ?, ?) ON CONFLICT (key) DO NOTHING",
        (record_key, "{}", now, now, task),
    )


def close_record(cur: Cursor, record_key: str, survivor: str) -> None:
    """Make the record (just written, in this transaction) a tombstone naming
    ``survivor``."""
    cur.execute("UPDATE records SET merged_into = ? WHERE key = ?", (survivor, record_key))


def reopen_record(cur: Cursor, record_key: str) -> None:
    """Make the tombstone ``record_key`` a live record again (a merge undone)."""
    cur.execute("UPDATE records SET merged_into = NULL WHERE key = ?", (record_key,))


def check_revision(cur: Cursor, record_key: str, expected: int) -> None:
    """In a write transaction: :class:`VersionConflict` unless the record is at
    ``expected`` (0: absent). What a refusal decided on that revision is written under."""
    cur.execute("SELECT revision FROM records WHERE key = ?", (record_key,))
    found = cur.fetchone()
    revision = int(found[0]) if found else 0
    if revision != expected:
        raise VersionConflict(record_key, expected, revision)


def keys_with_prefix(cur: Cursor, prefix: str, limit: int) -> list[str]:
    """Record keys starting with ``prefix`` (literally: no wildcards), in key order."""
    cur.execute(
        "SELECT key FROM records WHERE substr(key, 1, ?) = ? ORDER BY key LIMIT ?",
        (len(prefix), prefix, limit),
    )
    return [str(r[0]) for r in cur.fetchall()]


def records_after(d: Dialect, cur: Cursor, prefix: str, after: str, limit: int) -> list[Record]:
    """Up to ``limit`` records whose keys start with ``prefix`` and sort after ``after``,
    in key order (a sweep's page: each page a read of its own, no long transaction)."""
    cur.execute(
        f"SELECT {record_columns(d)} FROM records "
        "WHERE key > ? AND substr(key, 1, ?) = ? ORDER BY key LIMIT ?",
        (after, len(prefix), prefix, limit),
    )
    return [record_of(r) for r in cur.fetchall()]

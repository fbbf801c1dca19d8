"""Records: read one, write one under the revision check, list keys."""

from __future__ import annotations

import json
import time
from typing import Any

from ...routing.contract.errors import VersionConflict
from ..store import Record
from .dialect import Cursor, Dialect, dump_json


def read_record(d: Dialect, cur: Cursor, record_key: str) -> Record:
    """The record as it is now (revision 0 and no fields when absent)."""
    cur.execute(
        f"SELECT {d.json_out('fields')}, revision, updated_at FROM records WHERE key = ?",
        (record_key,),
    )
    row = cur.fetchone()
    if row is None:
        return Record(record_key, {}, 0)
    return Record(record_key, json.loads(row[0]), int(row[1]), float(row[2]))


def write_record(
    d: Dialect, cur: Cursor, record_key: str, fields: dict[str, Any], expected: int
) -> int:
    """The conditional write: the revision check and the revision advance are one
    statement, so two writers that read the same revision cannot both succeed."""
    now = time.time()
    if expected == 0:
        cur.execute(
            "INSERT INTO records (key, fields, revision, updated_at) "
            f"VALUES (?, {d.json_param}, 1, ?) ON CONFLICT (key) DO NOTHING "
            "RETURNING revision",
            (record_key, dump_json(fields), now),
        )
    else:
        cur.execute(
            f"UPDATE records SET fields = {d.json_param}, revision = revision + 1, "
            "updated_at = ? WHERE key = ? AND revision = ? RETURNING revision",
            (dump_json(fields), now, record_key, expected),
        )
    row = cur.fetchone()
    if row is None:
        cur.execute("SELECT revision FROM records WHERE key = ?", (record_key,))
        found = cur.fetchone()
        raise VersionConflict(record_key, expected, int(found[0]) if found else 0)
    return int(row[0])


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
        f"SELECT key, {d.json_out('fields')}, revision, updated_at FROM records "
        "WHERE key > ? AND substr(key, 1, ?) = ? ORDER BY key LIMIT ?",
        (after, len(prefix), prefix, limit),
    )
    return [Record(str(r[0]), json.loads(r[1]), int(r[2]), float(r[3])) for r in cur.fetchall()]

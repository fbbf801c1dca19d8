"""The store's logic, written once in SQL that SQLite and PostgreSQL both run.

Dialects differ in four places only: how a write transaction begins, how the shard's
fence row is locked, how JSON goes in and out, and the DDL (see :mod:`sql_base`).
"""

from __future__ import annotations

import json
import time
from typing import Any

from keylane.routing.contract.errors import AlreadyApplied, StaleFence, VersionConflict
from keylane.workers.stores.base import (
    DeadLetterDraft,
    EventWrite,
    Fence,
    JournalEntry,
    Record,
)
from keylane.workers.stores.sql_base import Cursor, dump_json
from keylane.workers.stores.sql_review import ReviewSql


class SqlStore(ReviewSql):
    """Store logic over a DB-API connection; see :mod:`keylane.workers.stores.base`."""

    # -- records -----------------------------------------------------------------------

    def read(self, record_key: str) -> Record:
        with self._cursor() as cur:
            cur.execute(
                self._q(
                    f"SELECT {self.json_out('fields')}, revision, updated_at "
                    "FROM records WHERE key = ?"
                ),
                (record_key,),
            )
            row = cur.fetchone()
        if row is None:
            return Record(record_key, {}, 0)
        return Record(record_key, json.loads(row[0]), int(row[1]), float(row[2]))

    def _write_record(
        self, cur: Cursor, record_key: str, fields: dict[str, Any], expected: int
    ) -> int:
        """The conditional write: the revision check and the revision advance are one
        statement, so two writers that read the same revision cannot both succeed."""
        now = time.time()
        if expected == 0:
            cur.execute(
                self._q(
                    "INSERT INTO records (key, fields, revision, updated_at) "
                    f"VALUES (?, {self.json_param}, 1, ?) ON CONFLICT (key) DO NOTHING "
                    "RETURNING revision"
                ),
                (record_key, dump_json(fields), now),
            )
        else:
            cur.execute(
                self._q(
                    f"UPDATE records SET fields = {self.json_param}, revision = revision + 1, "
                    "updated_at = ? WHERE key = ? AND revision = ? RETURNING revision"
                ),
                (dump_json(fields), now, record_key, expected),
            )
        row = cur.fetchone()
        if row is None:
            cur.execute(self._q("SELECT revision FROM records WHERE key = ?"), (record_key,))
            found = cur.fetchone()
            raise VersionConflict(record_key, expected, int(found[0]) if found else 0)
        return int(row[0])

    def write_outside(self, record_key: str, fields: dict[str, Any], expected_revision: int) -> int:
        with self._transaction() as cur:
            return self._write_record(cur, record_key, fields, expected_revision)

    def record_keys(self, prefix: str = "", limit: int = 100) -> list[str]:
        with self._cursor() as cur:
            cur.execute(
                self._q("SELECT key FROM records WHERE substr(key, 1, ?) = ? ORDER BY key LIMIT ?"),
                (len(prefix), prefix, limit),
            )
            return [str(r[0]) for r in cur.fetchall()]

    # -- fences ------------------------------------------------------------------------

    def _check_fence(self, cur: Cursor, fence: Fence | None) -> None:
        if fence is None:
            return
        current = self._lock_fence(cur, fence.shard)
        if current > fence.token:
            raise StaleFence(fence.shard, fence.token, current)
        if current < fence.token:
            # No row yet, or an older token: record ours, then look again. A concurrent
            # advance by a newer owner commits first or waits for us; either way the
            # second read sees the newest token (PostgreSQL: FOR SHARE finds nothing to
            # lock while the row does not exist, so the first read alone is not enough).
            self._upsert_fence(cur, fence.shard, fence.token)
            current = self._lock_fence(cur, fence.shard)
            if current > fence.token:
                raise StaleFence(fence.shard, fence.token, current)

    def _upsert_fence(self, cur: Cursor, shard: int, token: int) -> None:
        cur.execute(
            self._q(
                "INSERT INTO shard_fences (shard, token, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (shard) DO UPDATE SET token = excluded.token, "
                "updated_at = excluded.updated_at WHERE shard_fences.token < excluded.token"
            ),
            (shard, token, time.time()),
        )

    def advance_fence(self, shard: int, token: int) -> int:
        with self._transaction() as cur:
            self._upsert_fence(cur, shard, token)
            return self._lock_fence(cur, shard)

    def fence_of(self, shard: int) -> int:
        with self._cursor() as cur:
            cur.execute(self._q("SELECT token FROM shard_fences WHERE shard = ?"), (shard,))
            row = cur.fetchone()
        return int(row[0]) if row else 0

    # -- journal -----------------------------------------------------------------------

    def journal(self, source: str, event_id: str) -> JournalEntry | None:
        with self._cursor() as cur:
            return self._journal(cur, source, event_id)

    def _journal(self, cur: Cursor, source: str, event_id: str) -> JournalEntry | None:
        cur.execute(
            self._q(
                "SELECT record_key, shard, outcome, revision, attempts, recorded_at, fence "
                "FROM journal WHERE source = ? AND event_id = ?"
            ),
            (source, event_id),
        )
        row = cur.fetchone()
        if row is None:
            return None
        return JournalEntry(
            source,
            event_id,
            row[0],
            int(row[1]),
            row[2],
            row[3],
            int(row[4]),
            float(row[5]),
            row[6],
        )

    def _close_event(
        self,
        cur: Cursor,
        *,
        source: str,
        event_id: str,
        record_key: str,
        shard: int,
        outcome: str,
        attempts: int,
        fence: Fence | None,
        reopen: bool,
        revision: int | None = None,
    ) -> None:
        """Journal the event's outcome, or raise :class:`AlreadyApplied`.

        ``reopen`` is an operator's retry of a dead-lettered event: its journal entry
        exists with outcome ``dead_lettered`` and may be closed once more, once.
        """
        now = time.time()
        token = fence.token if fence else None
        if reopen:
            cur.execute(
                self._q(
                    "UPDATE journal SET outcome = ?, revision = ?, attempts = ?, fence = ?, "
                    "recorded_at = ? WHERE source = ? AND event_id = ? "
                    "AND outcome = 'dead_lettered'"
                ),
                (outcome, revision, attempts, token, now, source, event_id),
            )
            if cur.rowcount == 1:
                return
        cur.execute(
            self._q(
                "INSERT INTO journal (source, event_id, record_key, shard, outcome, revision, "
                "attempts, recorded_at, fence) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (source, event_id) DO NOTHING"
            ),
            (source, event_id, record_key, shard, outcome, revision, attempts, now, token),
        )
        if cur.rowcount == 1:
            return
        existing = self._journal(cur, source, event_id)
        raise AlreadyApplied(source, event_id, existing.outcome if existing else "recorded")

    def commit_event(self, write: EventWrite, fence: Fence | None) -> int:
        with self._transaction() as cur:
            self._check_fence(cur, fence)
            revision = write.expected_revision
            if write.fields is not None:
                revision = self._write_record(
                    cur, write.record_key, write.fields, write.expected_revision
                )
            # After the record: a duplicate is then refused here and rolls the write back.
            self._close_event(
                cur,
                source=write.source,
                event_id=write.event_id,
                record_key=write.record_key,
                shard=write.shard,
                outcome="applied",
                attempts=write.attempts,
                fence=fence,
                reopen=write.retry_of is not None,
                revision=revision if write.fields is not None else None,
            )
            return revision

    # -- dead letters ------------------------------------------------------------------

    def commit_dead_letter(
        self, draft: DeadLetterDraft, fence: Fence | None, close_event: bool = True
    ) -> int:
        with self._transaction() as cur:
            self._check_fence(cur, fence)
            if close_event:
                self._close_event(
                    cur,
                    source=draft.source,
                    event_id=draft.event_id,
                    record_key=draft.record_key,
                    shard=draft.shard,
                    outcome="dead_lettered",
                    attempts=draft.attempts,
                    fence=fence,
                    reopen=draft.retry_of is not None,
                )
            cur.execute(
                self._q(
                    "INSERT INTO dead_letters (created_at, source, event_id, record_key, shard, "
                    "reason, event, attempted_change, revision_read, revision_found, attempts, "
                    "error, status, retry_of) VALUES (?, ?, ?, ?, ?, ?, "
                    f"{self.json_param}, {self.json_param}, ?, ?, ?, ?, 'open', ?) RETURNING id"
                ),
                (
                    time.time(),
                    draft.source,
                    draft.event_id,
                    draft.record_key,
                    draft.shard,
                    draft.reason,
                    dump_json(draft.event),
                    dump_json(draft.attempted_change),
                    draft.revision_read,
                    draft.revision_found,
                    draft.attempts,
                    draft.error,
                    draft.retry_of,
                ),
            )
            return int(cur.fetchone()[0])

    def journal_entries(self, record_key: str | None = None) -> list[JournalEntry]:
        sql = (
            "SELECT source, event_id, record_key, shard, outcome, revision, attempts, "
            "recorded_at, fence FROM journal"
        )
        params: tuple[Any, ...] = ()
        if record_key is not None:
            sql += " WHERE record_key = ?"
            params = (record_key,)
        sql += " ORDER BY record_key, COALESCE(revision, 0), recorded_at"
        with self._cursor() as cur:
            cur.execute(self._q(sql), params)
            rows = cur.fetchall()
        return [
            JournalEntry(r[0], r[1], r[2], int(r[3]), r[4], r[5], int(r[6]), float(r[7]), r[8])
            for r in rows
        ]

    def journal_size(self) -> int:
        with self._cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM journal")
            return int(cur.fetchone()[0])

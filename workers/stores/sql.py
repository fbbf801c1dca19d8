"""The SQL store: every role of :mod:`keylane.workers.store` (records, journal, fences,
dead letters, retention, RabbitMQ's parking and tries, identities) written once, over one connection
of a :class:`~keylane.workers.stores.dialect.Dialect` (SQLite or PostgreSQL).

Each method is one transaction (or one read); the SQL it runs lives with its tables in
:mod:`.sql_records`, :mod:`.sql_fences`, :mod:`.sql_journal` and :mod:`.sql_dead_letters`,
a lane's commit (the record, what a merge step changes, the journal entries) in
:mod:`.sql_writes`, and what the prune reads and removes in :mod:`.sql_retention`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from ...routing.contract.errors import AlreadyApplied, StaleFence, VersionConflict
from ..delivery_store import KeptDelivery, KeptQuery
from ..store import (
    DeadLetterStore,
    FenceStore,
    IdentityStore,
    JournalStore,
    ParkingStore,
    RecordStore,
    RetentionStore,
    TryNotes,
)
from ..store_rows import (
    ArchiveRow,
    Commit,
    CommitRefused,
    DeadLetter,
    DeadLetterDraft,
    DeadLetterFilter,
    DeadLetterStatus,
    EventWrite,
    Fence,
    JournalEntry,
    Parked,
    PrunedTable,
    Record,
    RecordPage,
    RecordQuery,
    Removal,
    TableAge,
)
from . import sql_retention as retention
from .dialect import Dialect
from .schema import ADDED_INDEXES, added_columns, schema_ddl
from .sql_dead_letters import (
    count_dead_letters,
    find_dead_letter,
    insert_dead_letter,
    list_dead_letters,
    move_dead_letter,
)
from .sql_deliveries import (
    dead_letters_of,
    find_delivery,
    keep_dead_lettered,
    list_kept,
)
from .sql_fences import (
    check_fence,
    claim_next_token,
    lock_fence,
    stored_token,
    stored_tokens,
    upsert_fence,
)
from .sql_identities import identities_of, is_kept_apart, keep_apart, owners
from .sql_journal import count_entries, find_entry, list_entries, record_outcome
from .sql_parked import (
    count_delivery,
    count_messages,
    held_records,
    hold_record,
    park_messages,
    parked_rows,
    release_record,
    unpark_messages,
)
from .sql_record_query import list_records
from .sql_records import keys_with_prefix, read_record, records_after, write_record
from .sql_tries import forget_tries, note_try, noted_tries
from .sql_writes import commit_writes


class SqlStore(
    RecordStore,
    JournalStore,
    FenceStore,
    DeadLetterStore,
    RetentionStore,
    ParkingStore,
    TryNotes,
    IdentityStore,
):
    """A store in a SQL database, every role over one connection: ``dialect`` holds the
    connection and its differences. The code that opens and closes a connection holds
    this class (:func:`keylane.workers.stores.open_store`); it hands each part the role it
    uses."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        #: Whether the ``held`` table was seen (a table never goes once migrated).
        self._has_held = False

    def migrate(self) -> None:
        self.dialect.migrate(schema_ddl(self.dialect.column_types))
        for table, column, ddl in added_columns(self.dialect.column_types):
            self.dialect.add_column(table, column, ddl)
        self.dialect.migrate(ADDED_INDEXES)

    def close(self) -> None:
        self.dialect.close()

    def has_schema(self) -> bool:
        return self.dialect.has_table("records")

    # -- the write path (:mod:`.sql_writes`): effect, journal entry and fence check in one
    # transaction -------------------------------------------------------------------------

    def commit_group(self, commits: Sequence[Commit]) -> list[int | CommitRefused]:
        results: list[int | CommitRefused] = []
        with self.dialect.transaction() as cur:
            for n, commit in enumerate(commits):
                cur.execute(f"SAVEPOINT commit_{n}")
                try:
                    results.append(commit_writes(self.dialect, cur, commit))
                except (VersionConflict, AlreadyApplied, StaleFence) as exc:
                    cur.execute(f"ROLLBACK TO SAVEPOINT commit_{n}")
                    results.append(exc)
                cur.execute(f"RELEASE SAVEPOINT commit_{n}")
        return results

    def commit_dead_letter(
        self,
        draft: DeadLetterDraft,
        fence: Fence | None,
        close_event: bool = True,
        closed_by: EventWrite | None = None,
    ) -> int:
        d = self.dialect
        with d.transaction() as cur:
            if closed_by is not None:
                commit_writes(d, cur, Commit((closed_by,), fence))
                return insert_dead_letter(d, cur, draft)
            check_fence(d, cur, fence)
            if close_event:
                record_outcome(
                    cur,
                    source=draft.source,
                    event_id=draft.event_id,
                    record_key=draft.record_key,
                    shard=draft.shard,
                    outcome="dead_lettered",
                    attempts=draft.attempts,
                    fence=fence,
                    retry_of=draft.retry_of,
                    via=draft.event.get("via"),
                    delivery=draft.event.get("delivery"),
                )
            keep_dead_lettered(d, cur, draft.event)
            return insert_dead_letter(d, cur, draft)

    def write_outside(self, record_key: str, fields: dict[str, Any], expected_revision: int) -> int:
        with self.dialect.transaction() as cur:
            return write_record(self.dialect, cur, record_key, fields, expected_revision)

    def advance_fence(self, shard: int, token: int) -> int:
        with self.dialect.transaction() as cur:
            upsert_fence(cur, shard, token)
            return lock_fence(self.dialect, cur, shard)

    def claim_fence(self, shard: int) -> int:
        with self.dialect.transaction() as cur:
            return claim_next_token(cur, shard)

    def park(
        self,
        shard: int,
        record_key: str,
        messages: Sequence[tuple[bytes, int]],
        due_at: float,
        fence: Fence,
    ) -> None:
        with self.dialect.transaction() as cur:
            check_fence(self.dialect, cur, fence)
            park_messages(cur, shard, record_key, messages, due_at)

    def parked(
        self, shard: int, record_key: str | None = None, limit: int | None = None
    ) -> list[Parked]:
        with self.dialect.cursor() as cur:
            return parked_rows(cur, shard, record_key, limit)

    def parked_count(self, shard: int, record_key: str) -> int:
        with self.dialect.cursor() as cur:
            return count_messages(cur, shard, record_key)

    def count_parked(self, shard: int, record_key: str, seq: int, by: int = 1) -> None:
        with self.dialect.transaction() as cur:
            count_delivery(cur, shard, record_key, seq, by)

    def unpark(self, shard: int, record_key: str, seqs: Sequence[int], fence: Fence) -> int:
        with self.dialect.transaction() as cur:
            check_fence(self.dialect, cur, fence)
            return unpark_messages(cur, shard, record_key, seqs)

    def note_try(self, shard: int, digest: str) -> int:
        with self.dialect.transaction() as cur:
            return note_try(cur, shard, digest, time.time())

    def noted_tries(self, shard: int, digests: Sequence[str]) -> dict[str, int]:
        with self.dialect.cursor() as cur:
            return noted_tries(cur, shard, digests)

    def forget_tries(self, shard: int, digests: Sequence[str]) -> None:
        with self.dialect.transaction() as cur:
            forget_tries(cur, shard, digests)

    def hold(self, shard: int, record_key: str, dead_letter_id: int, fence: Fence) -> int | None:
        with self.dialect.transaction() as cur:
            check_fence(self.dialect, cur, fence)
            return hold_record(self.dialect, cur, shard, record_key, dead_letter_id, time.time())

    def held(self, shard: int, record_key: str | None = None) -> dict[str, int]:
        self._has_held = self._has_held or self.dialect.has_table("held")
        if not self._has_held:
            # A store no worker of this version has migrated yet (the CLI never migrates):
            # nothing can be held, since only such a worker writes a hold, after migrating.
            return {}
        with self.dialect.cursor() as cur:
            return held_records(cur, shard, record_key)

    def release(
        self,
        shard: int,
        record_key: str,
        dead_letter_id: int,
        due_at: float,
        fence: Fence,
        first: tuple[bytes, int] | None = None,
    ) -> bool:
        with self.dialect.transaction() as cur:
            check_fence(self.dialect, cur, fence)
            return release_record(cur, shard, record_key, dead_letter_id, due_at, first)

    # -- reads -----------------------------------------------------------------------------

    def read(self, record_key: str) -> Record:
        with self.dialect.cursor() as cur:
            return read_record(self.dialect, cur, record_key)

    def record_keys(self, prefix: str = "", limit: int = 100) -> list[str]:
        with self.dialect.cursor() as cur:
            return keys_with_prefix(cur, prefix, limit)

    def scan_records(self, prefix: str = "", after: str = "", limit: int = 500) -> list[Record]:
        with self.dialect.cursor() as cur:
            return records_after(self.dialect, cur, prefix, after, limit)

    def list_records(self, query: RecordQuery) -> RecordPage:
        with self.dialect.cursor() as cur:
            return list_records(self.dialect, cur, query)

    def fence_of(self, shard: int) -> int:
        with self.dialect.cursor() as cur:
            return stored_token(cur, shard)

    def fences(self) -> dict[int, int]:
        with self.dialect.cursor() as cur:
            return stored_tokens(cur)

    def journal(self, source: str, event_id: str) -> JournalEntry | None:
        with self.dialect.cursor() as cur:
            return find_entry(cur, source, event_id)

    def journal_entries(self, record_key: str | None = None) -> list[JournalEntry]:
        with self.dialect.cursor() as cur:
            return list_entries(cur, record_key)

    def journal_size(self) -> int:
        with self.dialect.cursor() as cur:
            return count_entries(cur)

    # -- identities ------------------------------------------------------------------------

    def identity_owners(self, identities: Sequence[str]) -> dict[str, str]:
        with self.dialect.cursor() as cur:
            return owners(cur, identities)

    def identities_of(self, record_key: str) -> list[str]:
        with self.dialect.cursor() as cur:
            return identities_of(cur, record_key)

    def kept_apart(self, a: str, b: str) -> bool:
        with self.dialect.cursor() as cur:
            return is_kept_apart(cur, a, b)

    def keep_apart(self, a: str, b: str, by: str) -> None:
        with self.dialect.transaction() as cur:
            keep_apart(cur, a, b, by)

    # -- review rows -----------------------------------------------------------------------

    def dead_letter(self, dead_letter_id: int) -> DeadLetter | None:
        with self.dialect.cursor() as cur:
            return find_dead_letter(self.dialect, cur, dead_letter_id)

    def dead_letters(self, flt: DeadLetterFilter) -> list[DeadLetter]:
        with self.dialect.cursor() as cur:
            return list_dead_letters(self.dialect, cur, flt)

    def set_dead_letter_status(
        self,
        dead_letter_id: int,
        to: DeadLetterStatus,
        allowed_from: tuple[str, ...],
        by: str,
        note: str | None = None,
    ) -> bool:
        if not allowed_from:
            return False
        with self.dialect.transaction() as cur:
            return move_dead_letter(cur, dead_letter_id, to, allowed_from, by, note)

    def dead_letter_stats(self) -> list[dict[str, Any]]:
        with self.dialect.cursor() as cur:
            return count_dead_letters(cur)

    # -- retention -------------------------------------------------------------------------

    def journal_sources(self) -> list[str]:
        with self.dialect.cursor() as cur:
            return retention.journal_sources(cur)

    def old_rows(
        self, table: PrunedTable, before: float, limit: int, source: str = ""
    ) -> list[ArchiveRow]:
        with self.dialect.cursor() as cur:
            return retention.old_rows(self.dialect, cur, table, before, limit, source)

    def count_old_rows(self, table: PrunedTable, before: float, source: str = "") -> int:
        with self.dialect.cursor() as cur:
            return retention.count_old_rows(cur, table, before, source)

    def remove_archived(self, table: PrunedTable, rows: Sequence[ArchiveRow]) -> Removal:
        if not rows:
            return Removal()
        with self.dialect.transaction() as cur:
            held_from = time.perf_counter()  # BEGIN IMMEDIATE has taken the write lock
            archived = retention.remove_archived(self.dialect, cur, table, rows)
        return Removal(archived, held_s=time.perf_counter() - held_from)

    def forget_archived_ids(self, before: float, limit: int) -> Removal:
        with self.dialect.transaction() as cur:
            held_from = time.perf_counter()
            forgotten = retention.forget_archived_ids(cur, before, limit)
        return Removal(forgotten=forgotten, held_s=time.perf_counter() - held_from)

    def reclaim_space(self) -> list[str]:
        return [t for t in ("journal", "archived_ids", "dead_letters") if self.dialect.reclaim(t)]

    def table_ages(self) -> dict[str, TableAge]:
        with self.dialect.cursor() as cur:
            return retention.table_ages(cur)

    def kept_delivery(self, delivery_id: str) -> KeptDelivery | None:
        with self.dialect.cursor() as cur:
            return find_delivery(self.dialect, cur, delivery_id)

    def kept_deliveries(self, query: KeptQuery) -> list[KeptDelivery]:
        with self.dialect.cursor() as cur:
            return list_kept(self.dialect, cur, query)

    def dead_letters_of(self, source: str, event_ids: list[str]) -> list[DeadLetter]:
        with self.dialect.cursor() as cur:
            return dead_letters_of(self.dialect, cur, source, event_ids)

    def find_journal(
        self, event_id: str | None = None, source: str | None = None, record_key: str | None = None
    ) -> list[JournalEntry]:
        with self.dialect.cursor() as cur:
            return retention.find_journal(cur, event_id, source, record_key)

    def maintenance_lock(self) -> AbstractContextManager[bool]:
        return self.dialect.maintenance_lock()

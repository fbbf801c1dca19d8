"""The record store's interfaces, one per role, each over one connection
(:class:`StoreConnection`): records with revisions (:class:`RecordStore`), the
applied-events journal (:class:`JournalStore`), shard fences (:class:`FenceStore`),
dead-letter review rows (:class:`DeadLetterStore`), what the prune removes
(:class:`RetentionStore`), RabbitMQ's parked and held records (:class:`ParkingStore`) and
its tries of redelivered messages (:class:`TryNotes`), and the identity index
(:class:`IdentityStore`). The values they take and give back are in
:mod:`keylane.workers.store_rows`.

One SQL implementation, :class:`keylane.workers.stores.sql.SqlStore`, is every role over
one connection. Code is typed against the roles it calls (a function that calls several
takes one parameter per role, and its caller passes the same connection for each); only
the code that opens and closes a connection holds the
:class:`~keylane.workers.stores.sql.SqlStore` itself (and the tests of the SQL store).

Every implementation keeps four promises, checked by the shared test suite:

* the store assigns revisions: a write names the revision it read and the statement that
  writes also advances it, so a stale write fails (:class:`VersionConflict`);
* the journal entry of an event is written in the same transaction as its effect, so a
  redelivered event has no second effect (:class:`AlreadyApplied`);
* a write carrying a fencing token older than the newest the store has seen for that
  shard is refused in the same transaction (:class:`StaleFence`);
* a dead-letter row and the journal entry that closes its event are one transaction.

A store object holds one connection and is used by one thread at a time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from .store_rows import (
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


class StoreConnection(ABC):
    """One connection to keylane's database: what every role below shares."""

    @abstractmethod
    def migrate(self) -> None:
        """Create or upgrade the schema (idempotent)."""

    @abstractmethod
    def has_schema(self) -> bool:
        """Whether keylane's tables are there (:meth:`migrate` has run)."""

    @abstractmethod
    def close(self) -> None:
        """Release the connection."""


class RecordStore(StoreConnection):
    """Records and the version-checked writes that carry their journal entries: the lanes
    (:mod:`keylane.workers.lane_store`, :mod:`keylane.workers.apply`), outside edits,
    repair sweeps and ``keylane records``."""

    @abstractmethod
    def read(self, record_key: str) -> Record:
        """The record as it is now (revision 0 and no fields when absent)."""

    def commit_event(self, write: EventWrite, fence: Fence | None) -> int:
        """Write an event's effect and its journal entry; return the new revision.

        Raises :class:`VersionConflict`, :class:`AlreadyApplied` or :class:`StaleFence`;
        in each case nothing was written.
        """
        return self.commit_events([write], fence)

    def commit_events(self, writes: Sequence[EventWrite], fence: Fence | None) -> int:
        """:meth:`commit_event` for consecutive events of one record, in one transaction:
        the record is written once, with the last write's fields, if it is still at the
        first write's ``expected_revision``, and each event gets its journal entry. All or
        nothing, with the same errors."""
        (result,) = self.commit_group([Commit(tuple(writes), fence)])
        if isinstance(result, Exception):
            raise result
        return result

    @abstractmethod
    def commit_group(self, commits: Sequence[Commit]) -> list[int | CommitRefused]:
        """Several lanes' :meth:`commit_events` in one transaction (one disk flush): each
        commit is all or nothing on its own, and its result is its new revision or the
        error that refused it (nothing of it written). Raises :class:`StoreUnavailable`
        when the transaction as a whole fails (nothing written)."""

    @abstractmethod
    def write_outside(self, record_key: str, fields: dict[str, Any], expected_revision: int) -> int:
        """A write from outside the lanes (a person, another system): same revision
        check, no journal. Returns the new revision or raises :class:`VersionConflict`."""

    @abstractmethod
    def record_keys(self, prefix: str = "", limit: int = 100) -> list[str]:
        """Record keys starting with ``prefix``, in key order."""

    @abstractmethod
    def scan_records(self, prefix: str = "", after: str = "", limit: int = 500) -> list[Record]:
        """Up to ``limit`` records whose keys start with ``prefix`` and sort after
        ``after``, in key order: a repair sweep reads the store page by page."""

    @abstractmethod
    def list_records(self, query: RecordQuery) -> RecordPage:
        """A page of the records ``query`` asks for, and where the next page starts
        (``keylane records list``): full unless it is the last."""


class JournalStore(StoreConnection):
    """The applied-events journal, read: the lanes' dedupe, ``keylane journal find``,
    ``keylane audit``."""

    @abstractmethod
    def journal(self, source: str, event_id: str) -> JournalEntry | None:
        """What happened to an event id, if anything (outcome ``archived``, without the
        record, once its row was archived and while its id is remembered)."""

    @abstractmethod
    def journal_size(self) -> int:
        """How many event ids the journal holds."""

    @abstractmethod
    def journal_entries(self, record_key: str | None = None) -> list[JournalEntry]:
        """Journal entries (of one record, or all), by record key then revision."""

    @abstractmethod
    def journal_sources(self) -> list[str]:
        """The sources the journal holds rows of."""

    @abstractmethod
    def find_journal(
        self, event_id: str | None = None, source: str | None = None, record_key: str | None = None
    ) -> list[JournalEntry]:
        """Journal rows in the table with this event id (of any source unless
        ``source`` is given) or of this record (and the events forwarded from it, their
        ``via``), by recorded time."""


class FenceStore(StoreConnection):
    """Shard fencing tokens: the ownership (a new owner's token), the RabbitMQ broker
    (one token per change of consumer), ``keylane check``."""

    @abstractmethod
    def advance_fence(self, shard: int, token: int) -> int:
        """Record ``token`` as the shard's newest if it is newer; return the newest."""

    @abstractmethod
    def claim_fence(self, shard: int) -> int:
        """Advance the shard's token by one and return it: a token no other claim got
        (brokers without a counter of their own, RabbitMQ, claim one per change of
        consumer)."""

    @abstractmethod
    def fence_of(self, shard: int) -> int:
        """The newest fencing token the store has seen for ``shard`` (0 if none)."""

    @abstractmethod
    def fences(self) -> dict[int, int]:
        """The newest fencing token of every shard the store has seen one for."""


class DeadLetterStore(StoreConnection):
    """Dead-letter review rows: the lanes write them, triage works through them."""

    @abstractmethod
    def commit_dead_letter(
        self,
        draft: DeadLetterDraft,
        fence: Fence | None,
        close_event: bool = True,
        closed_by: EventWrite | None = None,
    ) -> int:
        """Store a review row and, unless ``close_event`` is false, close its event in the
        journal (outcome ``dead_lettered``) in the same transaction; return the row id.
        ``closed_by``: the event is closed by that write instead (a refusal its source
        wants reviewed), checked as :meth:`commit_event` checks it.

        Raises :class:`AlreadyApplied` (the event already has an effect),
        :class:`StaleFence` or (``closed_by`` decided on a read the record moved from)
        :class:`VersionConflict`; in each case nothing was written.
        """

    @abstractmethod
    def dead_letters(self, flt: DeadLetterFilter) -> list[DeadLetter]:
        """Review rows matching ``flt``, oldest first."""

    @abstractmethod
    def dead_letter(self, dead_letter_id: int) -> DeadLetter | None:
        """One review row."""

    @abstractmethod
    def set_dead_letter_status(
        self,
        dead_letter_id: int,
        to: DeadLetterStatus,
        allowed_from: tuple[str, ...],
        by: str,
        note: str | None = None,
    ) -> bool:
        """Move a row to ``to`` if its status is one of ``allowed_from``; False if not."""

    @abstractmethod
    def dead_letter_stats(self) -> list[dict[str, Any]]:
        """Counts by status, reason and source, with the oldest row's time."""


class RetentionStore(StoreConnection):
    """What the prune reads and removes (:mod:`keylane.ops.retention`), and the tables'
    ages ``keylane status`` shows."""

    @abstractmethod
    def old_rows(
        self, table: PrunedTable, before: float, limit: int, source: str = ""
    ) -> list[ArchiveRow]:
        """Up to ``limit`` rows due for the archive, oldest first: journal rows of
        ``source`` recorded before ``before`` (but not those of a dead-lettered event whose
        review row is open, or was closed after ``before``: a retry must still find them);
        dead-letter rows closed (retried, discarded, resolved) before ``before``."""

    @abstractmethod
    def count_old_rows(self, table: PrunedTable, before: float, source: str = "") -> int:
        """How many rows :meth:`old_rows` would give without a limit."""

    @abstractmethod
    def remove_archived(self, table: PrunedTable, rows: Sequence[ArchiveRow]) -> Removal:
        """Delete ``rows`` (as :meth:`old_rows` gave them, now in a complete archive file)
        in one transaction, each only if it has not changed since; a journal row leaves
        its id in ``archived_ids``. The rows now in the archive alone are those deleted,
        and those already gone (an earlier, interrupted run deleted them); a row that
        changed (a dead letter retried meanwhile) stays in the table and is left out.
        Running it twice has the effect of running it once. ``held_s`` is the time from
        the moment the transaction held the write lock (SQLite; the rows' locks on
        PostgreSQL) to its commit: the most a lane could have waited on it."""

    @abstractmethod
    def forget_archived_ids(self, before: float, limit: int) -> Removal:
        """Forget up to ``limit`` archived event ids recorded before ``before`` (their
        replays are then new events); ``held_s`` as for :meth:`remove_archived`."""

    @abstractmethod
    def reclaim_space(self) -> list[str]:
        """After removals: make the space of the removed rows reusable where the
        database leaves that to a later job (PostgreSQL: a plain ``VACUUM`` of each table
        the prune removes from, once its dead rows are a tenth of its live ones; SQLite
        reuses freed pages by itself). The tables it did that for."""

    @abstractmethod
    def table_ages(self) -> dict[str, TableAge]:
        """Rows and oldest row of ``journal``, ``dead_letters`` (closed rows, by when
        they were closed) and ``archived_ids``."""

    @abstractmethod
    def maintenance_lock(self) -> AbstractContextManager[bool]:
        """Held by one process of the deployment at a time, for the prune: yields True
        when taken (released on exit, or when the process dies), False when another
        process holds it."""


class ParkingStore(StoreConnection):
    """Parked and held records on RabbitMQ: its shard consumers park a record's messages
    here when they cannot keep them in memory, and hold a record behind a dead letter
    (:mod:`keylane.workers.brokers.rabbitmq.parking`, ``.holding``); triage reads them."""

    @abstractmethod
    def park(
        self,
        shard: int,
        record_key: str,
        messages: Sequence[tuple[bytes, int]],
        due_at: float,
        fence: Fence,
    ) -> None:
        """Append ``messages`` (bytes, deliveries so far) to the record's parked messages
        and make them due at ``due_at`` (no messages: only the time), if ``fence`` is
        current; else :class:`StaleFence`, nothing written."""

    @abstractmethod
    def parked(
        self, shard: int, record_key: str | None = None, limit: int | None = None
    ) -> list[Parked]:
        """The shard's parked messages (only ``record_key``'s if given; the first
        ``limit``), in order per record."""

    @abstractmethod
    def parked_count(self, shard: int, record_key: str) -> int:
        """How many of the record's messages are parked (counted, not read)."""

    @abstractmethod
    def count_parked(self, shard: int, record_key: str, seq: int, by: int = 1) -> None:
        """Count one more delivery of a parked message (``by`` -1: one less)."""

    @abstractmethod
    def unpark(self, shard: int, record_key: str, seqs: Sequence[int], fence: Fence) -> int:
        """Forget the record's parked messages ``seqs`` (done with), if ``fence`` is
        current; how many of its messages are still parked."""

    @abstractmethod
    def hold(self, shard: int, record_key: str, dead_letter_id: int, fence: Fence) -> int | None:
        """Hold the record behind ``dead_letter_id`` (its parked messages are not due until
        :meth:`release`), if ``fence`` is current (else :class:`StaleFence`), nothing
        holds it yet and the row is open (or retried); the dead letter that holds it now
        (None: the row was closed first, nothing holds it)."""

    @abstractmethod
    def held(self, shard: int, record_key: str | None = None) -> dict[str, int]:
        """The shard's held records (only ``record_key``, if given) -> the dead letter
        that holds each. Empty on a store created before holds existed, not migrated since
        (a command of this version run before any worker of it started)."""

    @abstractmethod
    def release(
        self,
        shard: int,
        record_key: str,
        dead_letter_id: int,
        due_at: float,
        fence: Fence,
        first: tuple[bytes, int] | None = None,
    ) -> bool:
        """If ``dead_letter_id`` holds the record: release it, its parked messages due at
        ``due_at``, ``first`` (a message, deliveries so far) parked ahead of them; fenced
        like :meth:`park`. Whether it was released (False: nothing, or another row,
        holds it; nothing written)."""


class TryNotes(StoreConnection):
    """The tries of messages a broker handed out again, counted in the store: for a broker
    whose own delivery count also counts deliveries no lane tried (RabbitMQ takes back
    every unacknowledged delivery of a lost connection and counts each;
    :mod:`keylane.workers.brokers.rabbitmq.tries`)."""

    @abstractmethod
    def note_try(self, shard: int, digest: str) -> int:
        """Count one more try of the shard's message ``digest`` (committed before the try
        starts); its tries noted so far, this one included."""

    @abstractmethod
    def noted_tries(self, shard: int, digests: Sequence[str]) -> dict[str, int]:
        """The tries noted of the shard's messages ``digests`` (absent: none)."""

    @abstractmethod
    def forget_tries(self, shard: int, digests: Sequence[str]) -> None:
        """The shard's messages ``digests`` are done with: their notes leave."""


class IdentityStore(StoreConnection):
    """The identity index and the pairs kept apart: the lanes' merges
    (:mod:`keylane.workers.merges`), ``keylane records``, triage of a merge's review."""

    @abstractmethod
    def identity_owners(self, identities: Sequence[str]) -> dict[str, str]:
        """The record each of ``identities`` names (those the index has)."""

    @abstractmethod
    def identities_of(self, record_key: str) -> list[str]:
        """The identities that name ``record_key``."""

    @abstractmethod
    def kept_apart(self, a: str, b: str) -> bool:
        """Whether a person said records ``a`` and ``b`` are two (never merged)."""

    @abstractmethod
    def keep_apart(self, a: str, b: str, by: str) -> None:
        """Remember that ``a`` and ``b`` are two records: no merge of them is proposed
        again."""

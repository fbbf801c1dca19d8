"""What the record store holds and hands back, as values: a record as read
(:class:`Record`), an event's write and the group commit it joins (:class:`EventWrite`,
:class:`Commit`), the fence a lane writes under (:class:`Fence`), a journal entry, a
dead-letter review row and its filter, a parked message, and what the prune removes.

The roles that read and write them are in :mod:`keylane.workers.store`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ..routing.contract.errors import AlreadyApplied, StaleFence, VersionConflict

#: ``refused``: a condition on the record did not hold (or a task refused): an answer,
#: not a failure; never retried.
JournalOutcome = Literal["applied", "dead_lettered", "refused"]
#: The outcome :meth:`JournalStore.journal` gives an event whose row was archived.
ARCHIVED: Literal["archived"] = "archived"
DeadLetterStatus = Literal["open", "retried", "discarded", "resolved"]
DEAD_LETTER_STATUSES: tuple[str, ...] = get_args(DeadLetterStatus)
#: The review row reason of a merge whose records' fields differ.
MERGE_REVIEW = "merge_review"


#: The tables whose old rows the prune archives (the lease log lives in Redis).
PrunedTable = Literal["journal", "dead_letters", "deliveries"]
#: A row on its way to the archive: its columns, JSON-ready.
ArchiveRow = dict[str, Any]


@dataclass(frozen=True)
class TableAge:
    """How many rows a table holds, and the time of its oldest (None: empty)."""

    rows: int
    oldest: float | None


@dataclass(frozen=True)
class Removal:
    """What one of the prune's delete transactions did."""

    archived: list[ArchiveRow] = field(default_factory=list)  # now in the archive alone
    forgotten: int = 0  # archived ids forgotten
    held_s: float = 0.0  # how long it held what a lane may wait for


@dataclass(frozen=True)
class Record:
    """A record as read: its fields and the revision the store gave it (0: absent)."""

    key: str
    fields: dict[str, Any]
    revision: int
    updated_at: float | None = None
    #: When it was first written (None: absent, or written before records kept it).
    created_at: float | None = None
    #: The record that absorbed this one: a tombstone, its fields as they were then.
    merged_into: str | None = None
    #: The task whose record elsewhere this row stands for (None: keylane's own record).
    kept_for: str | None = None

    @property
    def exists(self) -> bool:
        """Whether the store has the record at all."""
        return self.revision > 0


@dataclass(frozen=True)
class Parked:
    """A message parked in the store (see :meth:`ParkingStore.park`)."""

    record_key: str
    seq: int
    raw: bytes
    deliveries: int
    due_at: float


@dataclass(frozen=True)
class Fence:
    """The shard and fencing token a lane writes under."""

    shard: int
    token: int


@dataclass(frozen=True)
class JournalEntry:
    """What happened to one sender event id."""

    source: str
    event_id: str
    record_key: str
    shard: int
    outcome: JournalOutcome | Literal["archived"]
    revision: int | None
    attempts: int
    recorded_at: float
    fence: int | None = None
    result: dict[str, Any] | None = None
    #: The record key the event was sent to, when it was forwarded from there to the
    #: record that absorbed it (``record_key``).
    via: str | None = None
    #: The id of the delivery the event came from (None: sent from Python).
    delivery: str | None = None


@dataclass(frozen=True)
class EventWrite:
    """An event's effect: the record's new fields, written if the record is still at
    ``expected_revision``, together with the event's journal entry."""

    source: str
    event_id: str
    record_key: str
    shard: int
    fields: dict[str, Any] | None  # None: journal the event, leave the record as it is
    expected_revision: int
    attempts: int
    retry_of: int | None = None
    #: ``refused``: journal a refusal (``fields`` is then None).
    outcome: JournalOutcome = "applied"
    #: The journal entry's result; an applied write that changes the record gets the new
    #: revision added as ``"revision"`` (see :func:`with_revision`).
    result: dict[str, Any] | None = None
    #: Decided on the record as read at ``expected_revision`` (a refusal by its
    #: conditions): written only if the record is still there, as a change would be.
    decided_on_read: bool = False
    #: Identities the write claims for its record (those no record holds yet).
    identities: tuple[str, ...] = ()
    #: The record becomes a tombstone naming this survivor (a merge's close).
    merged_into: str | None = None
    #: The identities of this absorbed record now name the written one (a merge's absorb).
    absorbs: str | None = None
    #: The record is elsewhere, kept by this task (one that merges): its row of no fields
    #: is written if absent, for its creation time and, once merged, its tombstone.
    keeps_key: str | None = None
    #: The tombstone is live again, kept apart from this survivor (a merge undone).
    reopens: str | None = None
    #: These identities of the written record name this reopened one again (a merge
    #: undone: the survivor releases what came with the absorbed record).
    releases: tuple[str, tuple[str, ...]] | None = None
    #: The record key a forwarded event was sent to (journaled with it).
    via: str | None = None
    #: The id of the delivery the event came from (journaled with it).
    delivery: str | None = None
    #: That delivery's request, to keep in ``deliveries`` (once per id) with the write:
    #: set when its source's window keeps this outcome.
    kept_request: dict[str, Any] | None = None


def with_revision(result: dict[str, Any] | None, revision: int) -> dict[str, Any] | None:
    """An applied write's result as journaled: its revision first, then the rest."""
    return None if result is None else {"revision": revision, **result}


@dataclass(frozen=True)
class Commit:
    """One lane's :meth:`RecordStore.commit_events` call, as part of a group."""

    writes: tuple[EventWrite, ...]
    fence: Fence | None


#: Why a commit of a group was refused (each leaves nothing of that commit written).
CommitRefused = VersionConflict | AlreadyApplied | StaleFence


@dataclass(frozen=True)
class DeadLetterDraft:
    """Everything a person needs to decide what to do with an event that did not apply."""

    source: str
    event_id: str
    record_key: str
    shard: int
    reason: str
    event: dict[str, Any]
    attempted_change: dict[str, Any]
    revision_read: int | None
    revision_found: int | None
    attempts: int
    error: str
    retry_of: int | None = None


@dataclass(frozen=True)
class DeadLetter(DeadLetterDraft):
    """A stored review row."""

    id: int = 0
    created_at: float = 0.0
    status: str = "open"
    status_by: str | None = None
    status_at: float | None = None
    note: str | None = None


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which review rows to list. Ages are in seconds; ``None`` means any."""

    statuses: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    record_key: str | None = None
    older_than_s: float | None = None
    newer_than_s: float | None = None
    ids: tuple[int, ...] = ()
    limit: int | None = None
    after_id: int | None = None  # only rows with a higher id: the next page


@dataclass(frozen=True)
class RecordQuery:
    """Which records to list (``keylane records list``): keys starting with ``prefix``
    (literally) and sorting after ``after``, in key order, whose fields hold each of
    ``where``'s values (the field present and equal as JSON: ``1`` is ``1.0``, never
    ``true``), at most ``limit``; tombstones (records merged into another) only with
    ``merged``."""

    prefix: str = ""
    where: tuple[tuple[str, Any], ...] = ()
    after: str = ""
    limit: int = 50
    merged: bool = False


@dataclass(frozen=True)
class RecordPage:
    """A page of :class:`RecordQuery`: its records, and the key the next page starts
    after (None: this is the last page)."""

    records: list[Record]
    next_after: str | None

"""The lanes' store: keylane's own store as awaitables, with group commit.

Every store call of a lane goes through :class:`LaneStore`: it runs in the lanes' blocking
pool (:mod:`keylane.workers.blocking`), on that thread's store connection, while the lane's
coroutine waits without holding a thread; each call takes the roles it uses of that
connection (:class:`~keylane.workers.store.RecordStore`, ``JournalStore``,
``DeadLetterStore``, ``IdentityStore``). A lane's reads, commits, journal look-ups and
dead letters are its methods, so the store leg of an event reads as a sequence of awaits.

Group commit: a store transaction costs about one disk flush, whatever it holds (SQLite
with ``synchronous = FULL``, PostgreSQL with ``synchronous_commit``), so a worker whose
lanes each committed alone would be held to one event per flush. A lane hands its commit
(:class:`~keylane.workers.store_rows.Commit`: one event's write, or a record's batch) to
:meth:`LaneStore.commit` and waits; while one transaction runs, the commits that arrive wait
together for the next one. Each commit stays all or nothing on its own (a savepoint each,
see :meth:`RecordStore.commit_group`): one lane's conflict or stale fence never touches
another's write, and a lane's answer is exactly what committing alone would have given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..routing.contract.errors import AlreadyApplied
from ..routing.contract.events import Event
from ..routing.contract.kept_deliveries import keeps
from . import dead_letters
from .blocking import BlockingPool
from .dead_letters import Failure
from .results import ApplyResult
from .store import DeadLetterStore, JournalStore, RecordStore
from .store_rows import (
    Commit,
    CommitRefused,
    EventWrite,
    Fence,
    JournalEntry,
    JournalOutcome,
    Record,
)

#: Commits in one transaction at most (a bound on how long its locks are held).
GROUP_MAX = 64


class LaneStore:
    """The store of one process's lanes (loop-side; the calls run in ``io``'s threads)."""

    def __init__(self, io: BlockingPool, group_max: int = GROUP_MAX) -> None:
        self.io = io
        self.group_max = group_max
        self._waiting: list[tuple[Commit, asyncio.Future[int | CommitRefused]]] = []
        self._running = False
        self._task: asyncio.Task[None] | None = None

    async def read(self, record_key: str) -> Record:
        """The record as it is now (a fresh read)."""
        return await self.io.store(_read, record_key)

    async def commit(self, writes: Sequence[EventWrite], fence: Fence | None) -> int:
        """:meth:`RecordStore.commit_events`, in the next group: the new revision, or its
        error (:class:`VersionConflict`, :class:`AlreadyApplied`, :class:`StaleFence`)."""
        future: asyncio.Future[int | CommitRefused] = asyncio.get_running_loop().create_future()
        self._waiting.append((Commit(tuple(writes), fence), future))
        if not self._running:
            self._running = True
            self._task = asyncio.create_task(self._drain())
        result = await future
        if isinstance(result, Exception):
            raise result
        return result

    async def journal(self, events: Sequence[Event]) -> list[JournalEntry | None]:
        """Each event's journal entry, if it has one."""
        return await self.io.store(_journal_entries, list(events))

    async def journal_delivered(
        self,
        events: Sequence[Event],
        fence: Fence,
        attempts: int,
        outcome: JournalOutcome = "applied",
        result: dict[str, Any] | None = None,
        reason: str | None = None,
        keeps_keys: str | None = None,
    ) -> list[ApplyResult]:
        """Journal events a destination took, or refused (no record change), each with
        ``result``: together, or each on its own when one of them already has an outcome.
        ``keeps_keys`` (the name of a task that merges): with the row of the record's key,
        the identities the events claim, and what a merge's absorb moves."""
        done = ApplyResult(outcome, attempts=attempts, reason=reason, result=result)
        return await self.io.store(_journal_delivered, list(events), fence, done, keeps_keys)

    async def dead_letter(self, event: Event, fence: Fence | None, failure: Failure) -> ApplyResult:
        """:func:`keylane.workers.dead_letters.dead_letter`."""
        return await self.io.store(dead_letters.dead_letter, event, fence, failure)

    async def dead_letters(
        self, events: Sequence[Event], fence: Fence | None, failure: Failure
    ) -> list[ApplyResult]:
        """:func:`keylane.workers.dead_letters.dead_letters`."""
        return await self.io.store(dead_letters.dead_letters, list(events), fence, failure)

    async def refuse_with_review(
        self, event: Event, write: EventWrite, fence: Fence | None, refused: ApplyResult
    ) -> ApplyResult:
        """:func:`keylane.workers.dead_letters.refuse_with_review`."""
        return await self.io.store(dead_letters.refuse_with_review, event, write, fence, refused)

    async def journal_refused_with_review(
        self,
        events: Sequence[Event],
        fence: Fence,
        attempts: int,
        result: dict[str, Any] | None,
        reason: str | None,
        keeps_keys: str | None = None,
    ) -> list[ApplyResult]:
        """Journal events a destination refused, each with its review row in the same
        transaction (a ``duplicate`` for one the journal already closed); ``keeps_keys``
        as for :meth:`journal_delivered`."""
        refused = ApplyResult("refused", attempts=attempts, reason=reason, result=result)
        return await self.io.store(_refused_with_review, list(events), fence, refused, keeps_keys)

    async def review(self, event: Event, fence: Fence | None) -> ApplyResult:
        """:func:`keylane.workers.dead_letters.review`."""
        return await self.io.store(dead_letters.review, event, fence)

    async def malformed(self, shard: int, raw: bytes, error: str, fence: Fence) -> int:
        """:func:`keylane.workers.dead_letters.malformed`."""
        return await self.io.store(dead_letters.malformed, shard, raw, error, fence)

    async def unreadable(
        self, shard: int, raw: bytes, version: int | None, record_key: str, fence: Fence
    ) -> int:
        """:func:`keylane.workers.dead_letters.unreadable`."""
        return await self.io.store(dead_letters.unreadable, shard, raw, version, record_key, fence)

    async def open_dead_letter(self, event: Event) -> int | None:
        """:func:`keylane.workers.dead_letters.open_dead_letter`."""
        return await self.io.store(lambda store: dead_letters.open_dead_letter(store, store, event))

    async def _drain(self) -> None:
        try:
            while self._waiting:
                group = self._waiting[: self.group_max]
                del self._waiting[: self.group_max]
                try:
                    results = await self.io.store(_commit_group, [c for c, _ in group])
                except Exception as exc:  # the transaction as a whole: every lane sees it
                    for _, future in group:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(group, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._running = False


def _read(store: RecordStore, record_key: str) -> Record:
    return store.read(record_key)


def _commit_group(store: RecordStore, commits: list[Commit]) -> list[int | CommitRefused]:
    return store.commit_group(commits)


def _journal_entries(store: JournalStore, events: list[Event]) -> list[JournalEntry | None]:
    return [store.journal(event.source, event.event_id) for event in events]


def _journal_delivered(
    store: RecordStore,
    events: list[Event],
    fence: Fence,
    done: ApplyResult,
    keeps_keys: str | None,
) -> list[ApplyResult]:
    attempts = done.attempts
    outcome: JournalOutcome = "refused" if done.outcome == "refused" else "applied"
    writes = [
        _kept(event_write(e, None, 0, attempts, outcome, done.result), e, keeps_keys)
        for e in events
    ]
    try:
        store.commit_events(writes, fence)
        return [done] * len(events)
    except AlreadyApplied:
        results = []
        for write in writes:
            try:
                store.commit_event(write, fence)
                results.append(done)
            except AlreadyApplied:
                results.append(ApplyResult("duplicate", attempts=attempts))
        return results


def _kept(write: EventWrite, event: Event, keeps_keys: str | None) -> EventWrite:
    """``write`` of an event of a task that merges (``keeps_keys``: its name): with the row
    of its key, the identities it claims, and what a merge's absorb moves."""
    if keeps_keys is None:
        return write
    absorbs = None if event.merge is None else event.merge.absorbed
    return replace(write, keeps_key=keeps_keys, identities=event.identities, absorbs=absorbs)


def _refused_with_review(
    store: DeadLetterStore,
    events: list[Event],
    fence: Fence,
    refused: ApplyResult,
    keeps_keys: str | None,
) -> list[ApplyResult]:
    results = []
    for event in events:
        write = event_write(event, None, 0, refused.attempts, "refused", refused.result)
        write = _kept(write, event, keeps_keys)
        try:
            results.append(dead_letters.refuse_with_review(store, event, write, fence, refused))
        except AlreadyApplied:
            results.append(ApplyResult("duplicate", attempts=refused.attempts))
    return results


def event_write(
    event: Event,
    fields: dict[str, Any] | None,
    expected_revision: int,
    attempts: int,
    outcome: JournalOutcome = "applied",
    result: dict[str, Any] | None = None,
    decided_on_read: bool = False,
) -> EventWrite:
    """The store write of ``event``'s effect (``fields`` None: journal it, no record change;
    ``outcome`` ``refused`` with ``decided_on_read``: journal its refusal, written only if
    the record is still at ``expected_revision``)."""
    return EventWrite(
        source=event.source,
        event_id=event.event_id,
        record_key=event.record_key,
        shard=event.shard,
        fields=fields,
        expected_revision=expected_revision,
        attempts=attempts,
        retry_of=event.retry_of,
        outcome=outcome,
        result=result,
        decided_on_read=decided_on_read,
        via=event.via,
        delivery=event.delivery,
        kept_request=kept_for(event, outcome),
    )


def kept_for(event: Event, outcome: str) -> dict[str, Any] | None:
    """The request of ``event``'s delivery to keep with its ``outcome``, if its source's
    window keeps it (:func:`~keylane.routing.contract.kept_deliveries.keeps`)."""
    request = event.request
    if request is None or not keeps(str(request.get("window")), outcome):
        return None
    return request

"""Applying one event to its record: fresh read, change, conditional write, bounded retry.

This is the whole of the write discipline (invariants 2, 5 and 6):

1. the journal entry is written in the transaction of the effect: an event id that already
   has an outcome makes that transaction fail, so it has no second effect;
2. each attempt reads the record fresh and re-applies the change to what it read;
3. the write names the revision it read; the store refuses it if the record moved on,
   and the attempt is repeated from a fresh read, at most ``max_attempts`` times;
4. what still does not apply becomes a dead-letter row carrying the attempted change,
   the revision read and the revision found; the lane then moves on.

Retrying happens here, in place: never ``Task.retry`` or a requeue, which would put the
event behind later events of the same record.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..routing.contract.errors import (
    AlreadyApplied,
    ChangeNotApplicable,
    FieldNotOwned,
    HandlerTimeout,
    InvalidHandlerResult,
    VersionConflict,
)
from ..routing.contract.events import Change, Event, parse_changes
from ..routing.contract.sources import SourceConfig
from . import merge_undo, merges
from .apply_rules import ApplyRules
from .blocking import BlockingPool
from .changes import apply_changes
from .conditions import REFUSED_BY_CONDITION, check_conditions
from .dead_letters import Failure
from .faults import before_write
from .jobs import import_function
from .lane_store import LaneStore, event_write
from .results import ApplyResult
from .store_rows import EventWrite, Fence, Record, with_revision

#: A source's lane-side handler: (event, record as freshly read) -> the change to apply,
#: or None for none; a plain function or an ``async def``. It runs on every attempt, so it
#: always computes from the current record.
Handler = Callable[
    [Event, Record], "Mapping[str, Any] | Awaitable[Mapping[str, Any] | None] | None"
]
#: A source's batch handler: (a record's waiting events in order, the record as freshly
#: read) -> one change (or None) per event, in the same order.
BatchHandler = Callable[[list[Event], Record], Any]

#: What a merge step does, by its name (:mod:`.merges`, :mod:`.merge_undo`).
MERGE_STEPS = {
    "close": merges.close,
    "absorb": merges.absorb,
    "reopen": merge_undo.reopen,
    "release": merge_undo.release,
}


@dataclass(frozen=True)
class SourceHandler:
    """A source's handler as loaded: a :data:`Handler`, or a :data:`BatchHandler`."""

    fn: Handler | BatchHandler
    batched: bool = False


def load_source_handler(source: SourceConfig) -> SourceHandler | None:
    """The source's ``handler`` or ``batch_handler`` (``"module:function"``), imported from
    the user's code; ``ConfigError`` says why it cannot be."""
    path = source.batch_handler or source.handler
    if path is None:
        return None
    fn = import_function(f"source {source.name}: handler", path)
    return SourceHandler(fn, batched=source.batch_handler is not None)


async def apply_events(
    store: LaneStore,
    events: Sequence[Event],
    fence: Fence | None,
    source: SourceConfig | None,
    rules: ApplyRules,
    handler: SourceHandler | None = None,
    read: Record | None = None,
) -> list[ApplyResult]:
    """Apply ``events`` (one, or a record's batch: see :func:`apply_batch`) once each (see
    the module docstring); the results of the first ones, in order. The store calls are the
    lanes' (:class:`LaneStore`: the write in its next group commit), an ``async def``
    handler runs on the lane's loop. Raises only for infrastructure errors
    (:class:`StoreUnavailable`), lost ownership (:class:`StaleFence`) and errors of the
    source's handler (the lane counts those and retries the delivery)."""
    event = events[0]
    if event.review is not None:
        return [await store.review(event, fence)]
    if event.merge is not None:
        step = MERGE_STEPS[event.merge.step]  # in the lane of the record it changes
        return [await step(store, event, fence, rules)]
    if source is None:
        error = f"source {event.source!r} is not configured"
        return [await store.dead_letter(event, fence, Failure("unknown_source", 1, error))]
    results = await apply_batch(store, events, fence, source, rules, handler, read)
    return await merges.with_proposals(store, events, results, rules.shards)


async def apply_batch(
    store: LaneStore,
    events: Sequence[Event],
    fence: Fence | None,
    source: SourceConfig,
    rules: ApplyRules,
    handler: SourceHandler | None = None,
    read: Record | None = None,
) -> list[ApplyResult]:
    """Apply consecutive events of one record of ``source`` as one: each attempt reads the
    record once, applies every event's change in order to what the one before left, and
    writes the record once with a journal entry per event, all in one transaction. A
    conflict re-reads and re-applies them all.

    Returns the results of the first events, in order: all of them, or fewer when a later
    event's change cannot apply (the events before it are written; it and those after it
    are untouched, for the lane to apply one by one) or when the write meets an event
    that already has an outcome (then the first alone is settled). The first event's
    refusal, and conflicts on every attempt, make it a dead letter, as for a single event.
    The handler's time limit holds for all of one attempt's handler calls together.
    ``read`` is the record as the caller read it since the events were taken, for the
    first attempt (one blocking call fewer); every other attempt reads it again.
    """
    first = events[0]
    max_attempts, faults = rules.max_attempts, rules.faults
    revision_read = found = 0
    for attempt in range(1, max_attempts + 1):
        if attempt == 1 and read is not None and read.key == first.record_key:
            record = read
        else:
            record = await store.read(first.record_key)
        if record.merged_into is not None:
            return merges.forward(events, record, rules.shards)
        revision_read = record.revision
        changes_of = _ChangesOf(store.io, handler, rules.handler_time_limit_s, events, record)
        writes = await _attempt_writes(store, fence, source, changes_of, attempt)
        if isinstance(writes, ApplyResult):
            return [writes]
        if faults:
            await store.io.store(before_write, faults, "worker.before_write", first.record_key)
        try:
            if writes[0].outcome == "refused":
                return [await _refuse(store, fence, source, first, writes[0], attempt)]
            revision = await store.commit(writes, fence)
        except VersionConflict as exc:
            found = exc.found
            continue
        except AlreadyApplied:
            if len(events) > 1:  # which one is unknown: settle the first alone
                return await apply_batch(store, events[:1], fence, source, rules, handler)
            return [ApplyResult("duplicate", attempts=attempt, conflicts=attempt - 1)]
        return [_applied(write, revision, attempt) for write in writes]
    error = f"revision moved from {revision_read} to {found} on each of {max_attempts} attempts"
    failure = Failure("conflict", max_attempts, error, revision_read, found, max_attempts)
    row = await store.dead_letter(first, fence, failure)
    return [row]


async def _attempt_writes(
    store: LaneStore,
    fence: Fence | None,
    source: SourceConfig,
    changes_of: _ChangesOf,
    attempt: int,
) -> list[EventWrite] | ApplyResult:
    """One attempt's writes: each event of ``changes_of`` with its change applied to what
    the one before left, from the record ``changes_of`` was given. They stop before the
    first event whose change cannot apply (it is taken again on its own); when that is the
    first event, its dead letter instead."""
    record = changes_of.record
    writes: list[EventWrite] = []
    fields = record.fields
    for index, event in enumerate(changes_of.events):
        if event.conditional:
            if writes:
                break  # checked on a fresh read of its own: it is taken again alone
            unmet = check_conditions(event.conditions, event.if_revision, fields, record.revision)
            if unmet is not None:
                refusal = unmet.as_result()
                refused = event_write(event, None, record.revision, attempt, "refused", refusal)
                return [replace(refused, decided_on_read=True)]
        try:
            changes = await changes_of.next(index, event, fields)
            after = (
                None
                if changes is None
                else apply_changes(fields, changes, source.ownership, source.name)
            )
        except (FieldNotOwned, ChangeNotApplicable, InvalidHandlerResult) as exc:
            if writes:
                break  # the events so far go in; this one is taken again on its own
            reason = next(r for kind, r in _REFUSALS.items() if isinstance(exc, kind))
            failure = Failure(reason, attempt, str(exc), record.revision)
            return await store.dead_letter(event, fence, failure)
        result = None if changes is None or after is None else changed_values(changes, after)
        write = event_write(event, after, record.revision, attempt, result=result)
        writes.append(replace(write, identities=event.identities))
        fields = fields if after is None else after
    return writes


def changed_values(changes: Mapping[str, Change], after: Mapping[str, Any]) -> dict[str, Any]:
    """An applied change's result (before its revision is known): the new value of each
    field it changed (None: removed)."""
    return {"fields": {name: after.get(name) for name in changes}}


def _applied(write: EventWrite, revision: int, attempt: int) -> ApplyResult:
    result = with_revision(write.result, revision) if write.fields is not None else write.result
    return ApplyResult(
        "applied", attempts=attempt, conflicts=attempt - 1, revision=revision, result=result
    )


async def _refuse(
    store: LaneStore,
    fence: Fence | None,
    source: SourceConfig,
    event: Event,
    write: EventWrite,
    attempt: int,
) -> ApplyResult:
    """Journal a refusal (under the revision its conditions were checked on; raises as a
    commit does), with its review row in the same transaction when the source asks for one
    (``on_refusal = "review"``)."""
    refused = ApplyResult(
        "refused",
        attempts=attempt,
        conflicts=attempt - 1,
        revision=write.expected_revision,
        reason=REFUSED_BY_CONDITION,
        result=write.result,
    )
    if source.on_refusal == "review":
        return await store.refuse_with_review(event, write, fence, refused)
    await store.commit([write], fence)
    return refused


#: The dead-letter reason of a change that cannot apply to the record as read (first match).
_REFUSALS: dict[type[Exception], str] = {
    FieldNotOwned: "not_owned",
    ChangeNotApplicable: "type",
    InvalidHandlerResult: "handler_error",
}


class _ChangesOf:
    """The change of each event of one attempt, in order: the event's own, or what the
    source's handler computes from the record as it stands before that event (a batch
    handler is called once, with every event). A plain handler runs in a pool thread and
    is timed; an ``async def`` one is awaited and cut at the time left."""

    def __init__(
        self,
        io: BlockingPool,
        handler: SourceHandler | None,
        time_limit_s: float,
        events: Sequence[Event],
        record: Record,
    ) -> None:
        self.io = io
        self.handler = handler
        self.events = events
        self.record = record
        self.deadline = time.monotonic() + time_limit_s
        self.limit_s = time_limit_s
        self.results: list[Any] | None = None

    async def next(
        self, index: int, event: Event, fields: dict[str, Any]
    ) -> dict[str, Change] | None:
        if self.handler is None:
            return dict(event.changes)
        if self.handler.batched:
            if self.results is None:
                self.results = list(await self._call(list(self.events), self.record))
                if len(self.results) != len(self.events):
                    raise InvalidHandlerResult(
                        f"the batch handler returned {len(self.results)} changes "
                        f"for {len(self.events)} events"
                    )
            result = self.results[index]
        else:
            record = Record(self.record.key, fields, self.record.revision)
            result = await self._call(event, record)
        if result is None:
            return None
        try:
            return parse_changes(dict(result))
        except (ValueError, TypeError) as exc:
            raise InvalidHandlerResult(f"the handler returned an invalid change: {exc}") from exc

    async def _call(self, *args: Any) -> Any:
        assert self.handler is not None
        handler = self.handler.fn
        left = self.deadline - time.monotonic()
        if inspect.iscoroutinefunction(handler):
            try:
                return await asyncio.wait_for(handler(*args), max(0.0, left))
            except TimeoutError:
                raise HandlerTimeout(f"handler ran past its limit of {self.limit_s:.1f}s") from None
        result = await self.io.call(handler, *args)
        if time.monotonic() > self.deadline:
            raise HandlerTimeout(f"handler ran past its limit of {self.limit_s:.1f}s")
        return result

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

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from keylane.routing.contract.errors import (
    AlreadyApplied,
    ChangeNotApplicable,
    FieldNotOwned,
    KeylaneError,
    VersionConflict,
)
from keylane.routing.contract.events import Change, Event, parse_changes
from keylane.routing.contract.faults import NO_FAULTS, Faults
from keylane.routing.contract.sources import SourceConfig
from keylane.workers.changes import apply_changes
from keylane.workers.stores.base import DeadLetterDraft, EventWrite, Fence, Record, Store

ApplyOutcome = Literal["applied", "duplicate", "dead_lettered"]

#: A source's lane-side handler: (event, record as freshly read) -> the change to apply,
#: or None for none. It runs on every attempt, so it always computes from the current record.
Handler = Callable[[Event, Record], "Mapping[str, Any] | None"]

REVIEW_ERRORS = {
    "id_reused": "the sender reused this event id with a different body; the first body "
    "was accepted, this one was not applied",
}


@dataclass(frozen=True)
class ApplyResult:
    """What became of one delivery."""

    outcome: ApplyOutcome
    attempts: int = 0
    conflicts: int = 0
    revision: int | None = None
    dead_letter_id: int | None = None
    reason: str | None = None


def apply_event(
    store: Store,
    event: Event,
    fence: Fence | None,
    source: SourceConfig | None,
    max_attempts: int,
    faults: Faults = NO_FAULTS,
    handler: Handler | None = None,
    handler_time_limit_s: float = 10.0,
) -> ApplyResult:
    """Apply ``event`` once (see the module docstring). Raises only for infrastructure
    errors (:class:`StoreUnavailable`), lost ownership (:class:`StaleFence`) and errors of
    the source's handler (the lane counts those and retries the delivery)."""
    if event.review is not None:
        return dead_letter(
            store,
            event,
            fence,
            event.review,
            attempts=1,
            close_event=False,
            error=REVIEW_ERRORS.get(event.review, event.review),
        )
    if source is None:
        return dead_letter(
            store,
            event,
            fence,
            "unknown_source",
            attempts=1,
            error=f"source {event.source!r} is not configured",
        )
    revision_read = found = 0
    for attempt in range(1, max_attempts + 1):
        record = store.read(event.record_key)
        revision_read = record.revision
        try:
            changes = _changes(event, record, handler, handler_time_limit_s)
            fields = (
                None
                if changes is None
                else apply_changes(record.fields, changes, source.ownership, source.name)
            )
        except FieldNotOwned as exc:
            return dead_letter(store, event, fence, "not_owned", attempt, str(exc), record.revision)
        except ChangeNotApplicable as exc:
            return dead_letter(store, event, fence, "type", attempt, str(exc), record.revision)
        except InvalidHandlerResult as exc:
            return dead_letter(
                store, event, fence, "handler_error", attempt, str(exc), record.revision
            )
        faults.hit("worker.before_write", event.record_key, bump=lambda: _bump(store, event))
        write = event_write(event, fields, record.revision, attempt)
        try:
            revision = store.commit_event(write, fence)
        except VersionConflict as exc:
            found = exc.found
            continue
        except AlreadyApplied:
            return ApplyResult("duplicate", attempts=attempt, conflicts=attempt - 1)
        return ApplyResult("applied", attempts=attempt, conflicts=attempt - 1, revision=revision)
    return dead_letter(
        store,
        event,
        fence,
        "conflict",
        max_attempts,
        f"revision moved from {revision_read} to {found} on each of {max_attempts} attempts",
        revision_read,
        found,
        conflicts=max_attempts,
    )


def event_write(
    event: Event, fields: dict[str, Any] | None, expected_revision: int, attempts: int
) -> EventWrite:
    """The store write of ``event``'s effect (``fields`` None: journal it, no record change)."""
    return EventWrite(
        source=event.source,
        event_id=event.event_id,
        record_key=event.record_key,
        shard=event.shard,
        fields=fields,
        expected_revision=expected_revision,
        attempts=attempts,
        retry_of=event.retry_of,
    )


class HandlerTimeout(RuntimeError):
    """The source's handler ran past ``handler_time_limit_ms``."""


class InvalidHandlerResult(KeylaneError):
    """The source's handler returned something that is not a change."""


def _changes(
    event: Event, record: Record, handler: Handler | None, time_limit_s: float
) -> dict[str, Change] | None:
    """The change to apply on this attempt: the event's own, or what the source's handler
    computes from the record as just read (None: nothing to change)."""
    if handler is None:
        return dict(event.changes)
    started = time.monotonic()
    result = handler(event, record)
    elapsed = time.monotonic() - started
    if elapsed > time_limit_s:
        raise HandlerTimeout(f"handler took {elapsed:.1f}s, over its limit of {time_limit_s:.1f}s")
    if result is None:
        return None
    try:
        return parse_changes(dict(result))
    except (ValueError, TypeError) as exc:
        raise InvalidHandlerResult(f"the handler returned an invalid change: {exc}") from exc


def dead_letter(
    store: Store,
    event: Event,
    fence: Fence | None,
    reason: str,
    attempts: int,
    error: str,
    revision_read: int | None = None,
    revision_found: int | None = None,
    conflicts: int = 0,
    close_event: bool = True,
) -> ApplyResult:
    """Record ``event`` for review and (unless ``close_event`` is false) close it in the
    journal, in one transaction."""
    draft = DeadLetterDraft(
        source=event.source,
        event_id=event.event_id,
        record_key=event.record_key,
        shard=event.shard,
        reason=reason,
        event=event.model_dump(mode="json"),
        attempted_change=event.changes_wire(),
        revision_read=revision_read,
        revision_found=revision_found if revision_found is not None else revision_read,
        attempts=attempts,
        error=error,
        retry_of=event.retry_of,
    )
    try:
        row = store.commit_dead_letter(draft, fence, close_event=close_event)
    except AlreadyApplied:
        return ApplyResult("duplicate", attempts=attempts, conflicts=conflicts)
    return ApplyResult(
        "dead_lettered", attempts=attempts, conflicts=conflicts, dead_letter_id=row, reason=reason
    )


def _bump(store: Store, event: Event) -> None:
    """An outside write that leaves the fields as they are but advances the revision."""
    record = store.read(event.record_key)
    with contextlib.suppress(VersionConflict):
        store.write_outside(event.record_key, record.fields, record.revision)

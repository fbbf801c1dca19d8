"""Dead letters from the lanes: an event that cannot apply becomes a review row (with the
attempted change, the revisions read and found, the error), closed in the journal in the
same transaction, and an alert.

Every way an event ends up here goes through this module: a change that does not fit the
record or touches a field its source does not own, conflicts on every attempt, a
destination that gave up or kept failing, a handler that failed every delivery, a message
that killed its worker every time (``poison``), bytes that are not a keylane message
(``malformed``), a message of a wire version this worker does not read
(``wire_version``), a reused event id (``id_reused``). The functions here run in a lane's
pool thread, on that thread's store connection (:class:`keylane.workers.lane_store.LaneStore`
awaits them).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import sentry_sdk
from pydantic import ValidationError

from ..routing.contract.destinations import EXCERPT_CHARS
from ..routing.contract.errors import AlreadyApplied, MalformedMessage
from ..routing.contract.events import Event
from ..routing.contract.message import parse_message
from ..routing.contract.wire import READS
from .results import ApplyResult
from .store import DeadLetterStore, JournalStore
from .store_rows import DeadLetterDraft, DeadLetterFilter, EventWrite, Fence

log = logging.getLogger("keylane.alerts")

#: What a review row says of an event the receiver already flagged.
REVIEW_ERRORS = {
    "id_reused": "the sender reused this event id with a different body; the first body "
    "was accepted, this one was not applied",
}


@dataclass(frozen=True)
class Failure:
    """Why an event becomes a dead letter, and what its attempts saw."""

    reason: str
    attempts: int
    error: str
    #: The record's revision the attempts read, and the one they found at the write
    #: (None: the one read).
    revision_read: int | None = None
    revision_found: int | None = None
    conflicts: int = 0


def dead_letter(
    store: DeadLetterStore,
    event: Event,
    fence: Fence | None,
    failure: Failure,
    close_event: bool = True,
) -> ApplyResult:
    """Record ``event`` for review and (unless ``close_event`` is false) close it in the
    journal, in one transaction; a ``duplicate`` when the journal already closed it."""
    try:
        row = store.commit_dead_letter(draft_of(event, failure), fence, close_event=close_event)
    except AlreadyApplied:
        return ApplyResult("duplicate", attempts=failure.attempts, conflicts=failure.conflicts)
    return ApplyResult(
        "dead_lettered",
        attempts=failure.attempts,
        conflicts=failure.conflicts,
        dead_letter_id=row,
        reason=failure.reason,
    )


def draft_of(event: Event, failure: Failure) -> DeadLetterDraft:
    """The review row of ``event`` that ``failure`` describes."""
    return DeadLetterDraft(
        source=event.source,
        event_id=event.event_id,
        record_key=event.record_key,
        shard=event.shard,
        reason=failure.reason,
        event=event.model_dump(mode="json"),
        attempted_change=event.changes_wire(),
        revision_read=failure.revision_read,
        revision_found=(
            failure.revision_found if failure.revision_found is not None else failure.revision_read
        ),
        attempts=failure.attempts,
        error=failure.error,
        retry_of=event.retry_of,
    )


def dead_letters(
    store: DeadLetterStore, events: Sequence[Event], fence: Fence | None, failure: Failure
) -> list[ApplyResult]:
    """A dead letter for each of ``events`` (one call's batch: the same failure)."""
    return [dead_letter(store, e, fence, failure) for e in events]


def review(store: DeadLetterStore, event: Event, fence: Fence | None) -> ApplyResult:
    """The review row of an event the receiver flagged (``event.review``), not applied."""
    assert event.review is not None
    error = REVIEW_ERRORS.get(event.review, event.review)
    return dead_letter(store, event, fence, Failure(event.review, 1, error), close_event=False)


def refuse_with_review(
    store: DeadLetterStore,
    event: Event,
    write: EventWrite,
    fence: Fence | None,
    refused: ApplyResult,
) -> ApplyResult:
    """Journal a refusal (``write``) and its review row in one transaction (a source's
    ``on_refusal = "review"``): ``refused`` with the row's id. The refusal stands: the row
    is for a person to see. A crash cannot leave one without the other. Raises as
    :meth:`DeadLetterStore.commit_dead_letter` does (``VersionConflict``: decide it again)."""
    result = refused.result or {}
    why = str(result.get("why") or refused.reason or "refused")
    revision = refused.revision
    failure = Failure(refused.reason or "refused", refused.attempts, why, revision, revision)
    row = store.commit_dead_letter(draft_of(event, failure), fence, closed_by=write)
    return replace(refused, dead_letter_id=row)


def malformed(
    store: DeadLetterStore, shard: int, raw: bytes, error: str, fence: Fence | None
) -> int:
    """The review row of bytes in a shard queue that are not a keylane message."""
    event = {"raw": raw[:4096].decode("utf-8", "replace")}
    return _row_of_bytes(store, shard, raw, "malformed", event, "", error, fence)


def unreadable(
    store: DeadLetterStore,
    shard: int,
    raw: bytes,
    version: int | None,
    record_key: str,
    fence: Fence | None,
) -> int:
    """The review row of a message of a wire version this worker does not read
    (:mod:`keylane.routing.contract.wire`): kept whole, so that ``keylane dlq retry``
    queues it again as it came once a worker that reads it runs."""
    event = {"raw": raw.decode("utf-8", "replace"), "wire": version}
    error = (
        f"a message of wire version {version} (this worker reads {', '.join(map(str, READS))}):"
        " it was written by a newer keylane; upgrade this worker, then retry this row"
    )
    return _row_of_bytes(store, shard, raw, "wire_version", event, record_key, error, fence)


def _row_of_bytes(
    store: DeadLetterStore,
    shard: int,
    raw: bytes,
    reason: str,
    event: dict[str, Any],
    record_key: str,
    error: str,
    fence: Fence | None,
) -> int:
    """The review row of a message that is no event this worker can read. The bytes'
    digest is closed in the journal (source ``""``) in the same transaction, so a
    redelivery adds no second row: it gets the first row's id."""
    digest = hashlib.sha256(raw).hexdigest()
    draft = DeadLetterDraft(
        source="",
        event_id=f"sha256:{digest}",
        record_key=record_key,
        shard=shard,
        reason=reason,
        event=event,
        attempted_change={},
        revision_read=None,
        revision_found=None,
        attempts=1,
        error=error[:EXCERPT_CHARS],
    )
    try:
        return store.commit_dead_letter(draft, fence)
    except AlreadyApplied:
        flt = DeadLetterFilter(sources=("",), reasons=(reason,), record_key=record_key)
        first = [row.id for row in store.dead_letters(flt) if row.event_id == draft.event_id]
        if first:
            return first[0]
        # Its first row was archived, its id still remembered: a row to see again.
        return store.commit_dead_letter(draft, fence, close_event=False)


def open_dead_letter(journal: JournalStore, rows: DeadLetterStore, event: Event) -> int | None:
    """The open dead letter of ``event`` when the journal closed it as dead-lettered (a
    redelivery after a crash that came before the record was held)."""
    entry = journal.journal(event.source, event.event_id)
    if entry is None or entry.outcome != "dead_lettered":
        return None
    found = rows.dead_letters(
        DeadLetterFilter(statuses=("open",), sources=(event.source,), record_key=event.record_key)
    )
    return next((row.id for row in found if row.event_id == event.event_id), None)


def alert(event: Event, result: ApplyResult) -> None:
    """Log and report a new dead letter (a Sentry event when Sentry is configured; the
    ``dead_lettered`` counter counts it). Only ids and the reason leave the process: never
    the event's body or its values."""
    log.warning(
        "dead letter %s: %s/%s on %s (shard %s): %s",
        result.dead_letter_id,
        event.source,
        event.event_id,
        event.record_key,
        event.shard,
        result.reason,
    )
    if not sentry_sdk.is_initialized():
        return
    with sentry_sdk.new_scope() as scope:
        scope.set_tag("keylane.source", event.source)
        scope.set_tag("keylane.event_id", event.event_id)
        scope.set_tag("keylane.record_key", event.record_key)
        scope.set_tag("keylane.shard", str(event.shard))
        scope.set_tag("keylane.reason", result.reason or "")
        scope.fingerprint = ["keylane-dead-letter", event.source, result.reason or ""]
        sentry_sdk.capture_message(
            f"dead letter {result.dead_letter_id}: {result.reason} ({event.source})",
            level="warning",
        )


def past_delivery_limit(store: DeadLetterStore, raw: bytes, deliveries: int) -> ApplyResult | int:
    """The ``poison`` dead letter of a message the broker dead-lettered past its delivery
    limit (RabbitMQ: handed out that often and never acknowledged; a worker killed each
    time). A message that is not a keylane event is a ``malformed`` review row. No fence:
    the message has left its shard queue, no lane holds it any more."""
    try:
        message = parse_message(raw)
        event = Event.model_validate(message.kwargs.get("event"))
    except (MalformedMessage, ValidationError, TypeError, ValueError) as exc:
        return malformed(store, -1, raw, str(exc), None)
    error = f"handed out {deliveries} times and never finished (the worker died each time)"
    return dead_letter(store, event, None, Failure("poison", deliveries, error))

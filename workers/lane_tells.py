"""What a lane tells about the events it decided: the told outcome
(``routing/contract/outcomes.py``) that goes with an event's acknowledgement
(:class:`~keylane.workers.broker.Tell`), so that whoever waits for it, asks for it or
replays the event hears what the journal says.

* A delivery the lane decided (``applied``, ``refused``, ``dead_lettered``) is told from
  its result, right after the store committed it.
* A delivery the journal had already decided (a ``duplicate``: redelivered after a crash
  between the store's commit and the acknowledgement, or sent again) is told again from
  the journal, so a tell lost with its worker is healed by the next delivery. A key that is
  already there stands (the broker keeps the first tell) and is published again.
* An operator's retry of a dead letter (``retry_of``) decides its event anew: its tell
  replaces the one before. A review message of a reused id tells nothing: its outcome is
  not its event's.
"""

from __future__ import annotations

import logging
from typing import get_args

from ..routing.contract.events import Event
from ..routing.contract.outcomes import Told, ToldStatus, encode_told
from ..routing.contract.settings import Settings
from ..routing.contract.sources import Sources
from .broker import Tell
from .results import ApplyResult
from .store import DeadLetterStore, JournalStore
from .store_rows import DeadLetterFilter

log = logging.getLogger("keylane.lanes")

_TOLD: tuple[str, ...] = get_args(ToldStatus)


def tells(event: Event) -> bool:
    """Whether a decision about ``event`` is told at all (a review message's is not, nor
    a merge step's: it is keylane's own)."""
    return event.review is None and event.merge is None


def told_of(event: Event, result: ApplyResult, decided_at: float) -> Told | None:
    """The told outcome of a delivery the lane decided now; None for a duplicate (told
    from the journal instead, :func:`journal_told`)."""
    if result.outcome not in _TOLD:
        return None
    return Told(
        status=result.outcome,  # type: ignore[arg-type]
        source=event.source,
        event_id=event.event_id,
        record_key=event.record_key,
        revision=result.revision,
        result=result.result,
        reason=result.reason,
        dead_letter_id=result.dead_letter_id,
        decided_at=decided_at,
    )


def journal_told(journal: JournalStore, rows: DeadLetterStore, event: Event) -> Told | None:
    """(In a pool thread.) The outcome the journal keeps for ``event``, as told, with the
    review row that closed it; None when it has none to tell (no row, or archived: its
    record data is gone from the store)."""
    entry = journal.journal(event.source, event.event_id)
    if entry is None or entry.outcome not in _TOLD:
        return None
    dead_letter_id, reason = None, None
    if entry.result is not None and isinstance(entry.result.get("reason"), str):
        reason = entry.result["reason"]  # a refusal's
    if entry.outcome in ("dead_lettered", "refused"):
        # The event's newest row: the one that closed it (a retry that failed again
        # closed it with a newer row), or the review row made with its refusal (a
        # source with on_refusal = "review"; none otherwise).
        found = rows.dead_letters(
            DeadLetterFilter(sources=(event.source,), record_key=event.record_key)
        )
        mine = [row for row in found if row.event_id == event.event_id]
        if mine:
            dead_letter_id, reason = mine[-1].id, mine[-1].reason
    kept = ApplyResult(
        entry.outcome,  # type: ignore[arg-type]
        revision=entry.revision,
        dead_letter_id=dead_letter_id,
        reason=reason,
        result=entry.result,
    )
    return told_of(event, kept, entry.recorded_at)


def tell_of(told: Told | None, event: Event, settings: Settings, sources: Sources) -> Tell | None:
    """The :class:`Tell` that goes with the acknowledgement: kept ``outcome_keep_s`` (a
    replay after that is queued again by the receiver and told anew from here, by
    :func:`journal_told`), never longer than the event's dedupe mark (its source's
    retention); on RabbitMQ, whose receivers read the marks and outcomes without queueing
    a replay again, as long as that mark."""
    if told is None:
        return None
    source = sources.get(event.source)
    keep_s = settings.dedupe_retention_s if source is None else source.retention(settings)
    if not settings.broker_is_rabbitmq:
        keep_s = min(keep_s, settings.outcome_keep_s)
    body = encode_told(told)
    return Tell(event.source, event.event_id, body, keep_s * 1000, event.retry_of is not None)

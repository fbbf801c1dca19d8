"""What became of one delivery, as a lane acknowledges it and counts it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .store_rows import JournalOutcome

if TYPE_CHECKING:
    from ..routing.contract.events import Event

#: ``applied``, ``refused`` and ``dead_lettered`` are journaled; ``duplicate``: the
#: journal already had the event, so this delivery had no effect; ``forwarded``: the
#: record was merged into another, the event went on to that record's lane.
ApplyOutcome = JournalOutcome | Literal["duplicate", "forwarded"]


@dataclass(frozen=True)
class ApplyResult:
    """What became of one delivery."""

    outcome: ApplyOutcome
    attempts: int = 0
    conflicts: int = 0
    revision: int | None = None
    dead_letter_id: int | None = None
    reason: str | None = None
    result: dict[str, Any] | None = None
    #: Events the lane queues (each to its record's shard) before it acknowledges this
    #: delivery: a merge's next step, a proposal, a forwarded event.
    sends: tuple[Event, ...] = ()
    #: The counter the acknowledgement adds one to, when not the outcome's own.
    counted_as: str | None = None

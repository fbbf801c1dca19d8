"""What became of one delivery, as a lane acknowledges it and counts it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .store import JournalOutcome

#: ``applied`` and ``dead_lettered`` are journaled; ``duplicate``: the journal already had
#: the event, so this delivery had no effect.
ApplyOutcome = JournalOutcome | Literal["duplicate", "refused"]


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

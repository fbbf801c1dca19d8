"""A scheduled job's state as Redis holds it (:class:`ScheduleState`), read the same way by
``keylane schedules`` and ``keylane status`` (``ops``, sync client) and ``/metrics`` (the
receiver, asyncio client): both queue the reads in ``producers/state_reads.py``.

Every tick of a job ends up in exactly one of four counters, and in the run log:

* ``started``: it ran at its time;
* ``buffered``: a run was still going; it ran right after that run (``buffer_one``);
* ``skipped``: a run was still going and the policy (``skip``, or ``buffer_one`` with a
  tick already waiting) dropped it;
* ``missed``: no scheduler ran it at its time (all were down, or busy past the next tick);
  only the latest of a row of missed ticks runs, late.

Runs: ``ok``, ``failed`` (the job raised), ``interrupted`` (its scheduler died or paused
past the lease) and ``rerun`` (an interrupted run started again, same tick).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .schedules import tick_text

TICK_OUTCOMES = ("started", "buffered", "skipped", "missed")
#: A job that no scheduler has stepped for this long is known to no running scheduler (a
#: scheduler steps each of its jobs at least once per ``KEYLANE_HEARTBEAT_MS``): it was
#: removed from the app, or every scheduler is down. Shown as such, its next run unknown.
UNSEEN_AFTER_S = 60.0
RUN_OUTCOMES = ("ok", "failed", "interrupted", "rerun")


@dataclass(frozen=True)
class ScheduleState:
    """One job as Redis holds it."""

    job: str
    definition: dict[str, Any]
    running_tick: int | None
    runner: str | None  # the lease value (owner/token) of the run in progress
    running_for_s: float | None
    attempt: int
    buffered_tick: int | None
    last_run: int | None
    last_outcome: str | None
    last_error: str | None
    last_finished_at: int | None
    last_success: int | None
    next_tick: int | None
    #: Seconds since a running scheduler last stepped the job (None: never, or a
    #: scheduler of a version that did not say).
    stepped_ago_s: float | None = None
    ticks: dict[str, int] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)

    @property
    def known(self) -> bool:
        """Whether a running scheduler has stepped the job lately (:data:`UNSEEN_AFTER_S`)."""
        return self.stepped_ago_s is not None and self.stepped_ago_s <= UNSEEN_AFTER_S

    @classmethod
    def of(cls, name: str, s: dict[str, str], lease: str | None, now_ms: int) -> ScheduleState:
        """Read the job's hash ``s`` (as text) and its lease's value, at ``now_ms``."""
        running = _ms(s.get("running"))
        started_at = _ms(s.get("started_at"))
        return cls(
            job=name,
            definition=json.loads(s["def"]) if s.get("def") else {},
            running_tick=running,
            runner=lease if running is not None else None,
            running_for_s=(
                round((now_ms - started_at) / 1000, 3)
                if running is not None and started_at is not None
                else None
            ),
            attempt=int(s.get("attempt") or 1),
            buffered_tick=_ms(s.get("buffered")),
            last_run=_ms(s.get("last_run")),
            last_outcome=s.get("last_outcome") or None,
            last_error=s.get("last_error") or None,
            last_finished_at=_ms(s.get("last_finished_at")),
            last_success=_ms(s.get("last_success")),
            next_tick=_ms(s.get("next_tick")),
            stepped_ago_s=_ago_s(now_ms, _ms(s.get("stepped_at"))),
            ticks={k: int(s.get(f"ticks_{k}") or 0) for k in TICK_OUTCOMES},
            runs={
                "ok": int(s.get("runs_ok") or 0),
                "failed": int(s.get("runs_failed") or 0),
                "interrupted": int(s.get("runs_interrupted") or 0),
                "rerun": int(s.get("runs_rerun") or 0),
            },
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, ticks as ISO 8601 text."""
        return {
            "job": self.job,
            **self.definition,
            "running": _text(self.running_tick),
            "runner": self.runner,
            "running_for_s": self.running_for_s,
            "attempt": self.attempt if self.running_tick is not None else None,
            "buffered": _text(self.buffered_tick),
            "last_run": _text(self.last_run),
            "last_outcome": self.last_outcome,
            "last_error": self.last_error or None,
            "last_success": _text(self.last_success),
            "next_run": _text(self.next_tick) if self.known else None,
            "scheduler_seen_s_ago": self.stepped_ago_s,
            "known_to_a_scheduler": self.known,
            "ticks": dict(self.ticks),
            "runs": dict(self.runs),
        }


def _ago_s(now_ms: int, at_ms: int | None) -> float | None:
    return None if at_ms is None else round(max(0, now_ms - at_ms) / 1000, 1)


def _text(ms: int | None) -> str | None:
    return None if ms is None else tick_text(ms)


def _ms(text: str | None) -> int | None:
    return int(text) if text else None

"""Destinations: where a lane sends an event instead of (or besides) keylane's own records.

One interface, one file per implementation, each the only file that imports its client
library:

* :mod:`keylane.workers.destinations.task` runs a registered user task;
* :mod:`keylane.workers.destinations.http_forward` POSTs the event to a URL (httpx);
* :mod:`keylane.workers.destinations.to_resource` writes the event's change where the record
  lives, version-checked (:mod:`keylane.workers.resources`: ETag, PostgreSQL table, stamped).

A destination is given, per event, the event and a :class:`Context` (the idempotency key,
stable across every retry and redelivery of the event; the attempt number; the deadline;
a logger bound to the event) and ends in one :class:`Outcome`:

* :class:`Done` — the effect happened; keylane journals it;
* :class:`RetryLater` — not now: the event waits *in place* (its record's later events
  wait behind it) for a delay, a ``Retry-After``, or exponential back-off;
* :class:`Conflict` — run again from a fresh read, at most ``max_attempts`` times;
* :class:`GiveUp` — a dead-letter row with the reason;
* :class:`Refuse` — a business answer: journaled ``refused`` with its reason, not retried.

Outcomes may be returned or raised. Anything else raised is an error of the call: it is
retried with back-off and then dead-lettered, as a handler's errors are.
"""

from __future__ import annotations

import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...routing.contract.destinations import DestinationConfig
from ...routing.contract.errors import ConfigError
from ...routing.contract.events import Event
from ...routing.contract.sources import Sources


class Outcome(Exception):
    """How a call to a destination ended. ``status`` and ``response`` describe the
    destination's answer (an HTTP status and an excerpt of its body), when there is one."""

    def __init__(self, detail: str = "", status: int | None = None, response: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.response = response


class Done(Outcome):
    """The effect happened. ``result`` (JSON-ready) is kept with its journal entry: what a
    task returned, a forward's status, what a version-checked write wrote."""

    def __init__(
        self,
        detail: str = "",
        status: int | None = None,
        response: str = "",
        result: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail, status, response)
        self.result = result


class Refuse(Outcome):
    """A business answer, not a failure: the event is journaled as ``refused`` with
    ``reason`` and ``details`` (JSON values), never retried, not a dead letter (unless its
    source asks for a review row of each refusal)."""

    def __init__(self, reason: str, **details: Any) -> None:
        super().__init__(reason)
        self.reason = reason
        self.details = details
        self.result: dict[str, Any] = {
            "reason": reason,
            "condition": None,
            "field": None,
            "seen": None,
            "revision": None,
            "why": reason,
            "details": details,
        }


class RetryLater(Outcome):
    """Not now: wait ``delay_s`` (None: exponential back-off with jitter) and call again,
    keeping the record's order. ``pause_destination`` makes every call to the destination
    wait (what a ``Retry-After`` on a 429 means)."""

    def __init__(
        self,
        detail: str = "",
        delay_s: float | None = None,
        pause_destination: bool = False,
        status: int | None = None,
        response: str = "",
    ) -> None:
        super().__init__(detail, status, response)
        self.delay_s = delay_s
        self.pause_destination = pause_destination


class Conflict(Outcome):
    """The write lost a race (the version moved): run again from a fresh read."""


class GiveUp(Outcome):
    """This event cannot succeed: make it a dead letter with ``detail`` as the reason.
    ``reason`` overrides the destination's dead-letter reason; ``revision_read`` and
    ``revision_found`` are the versions a version-checked destination saw."""

    def __init__(
        self,
        detail: str = "",
        status: int | None = None,
        response: str = "",
        reason: str | None = None,
        revision_read: int | None = None,
        revision_found: int | None = None,
    ) -> None:
        super().__init__(detail, status, response)
        self.reason = reason
        self.revision_read = revision_read
        self.revision_found = revision_found


@dataclass(frozen=True)
class Context:
    """What a destination is given besides the event."""

    idempotency_key: str
    attempt: int  # 1 on the first call of this event; grows with every retry and redelivery
    deadline: float  # time.time() by which the call should have ended
    log: logging.Logger | logging.LoggerAdapter[logging.Logger]
    destination: str
    #: The condition (JSON) of a write an earlier delivery of this event sent without
    #: seeing the answer (its worker died), and how to note the next one; keylane keeps
    #: them for version-checked destinations.
    write_in_doubt: str | None = None
    note_write: Callable[[str | None], None] | None = None

    @property
    def remaining_s(self) -> float:
        """Seconds left until the deadline (0 when past it)."""
        return max(0.0, self.deadline - time.time())


#: Runs a blocking ``fn(*args)`` off the lane's event loop (the lanes' thread pool).
Blocking = Callable[..., Awaitable[Any]]


class Destination(ABC):
    """One configured destination. A lane awaits :meth:`call`; a destination whose client
    waits without a thread (an ``async def`` task, an HTTP forward) overrides it, the others
    implement the blocking :meth:`call_blocking`, which the lane runs in its thread pool."""

    #: The dead-letter reason of a :class:`GiveUp`.
    give_up_reason = "gave_up"
    #: More than 1: it takes a record's waiting events together (:meth:`call_batch`).
    batch = 1
    #: Seconds a batch waits after its newest event for more (see the task's debounce).
    debounce_s = 0.0
    #: Whether two of its keys can be merged (a task with ``on_merge``): its events may
    #: name identities, keylane keeps a row per key, and a merge's absorb is a
    #: :meth:`call` of an event with ``merge`` (:mod:`keylane.workers.merges`).
    merges = False

    def __init__(self, config: DestinationConfig) -> None:
        self.config = config

    async def call(self, event: Event, context: Context, blocking: Blocking) -> Outcome:
        """Call the destination once for ``event``, from a lane."""
        outcome: Outcome = await blocking(self.call_blocking, event, context)
        return outcome

    def call_blocking(self, event: Event, context: Context) -> Outcome:
        """Call the destination once for ``event``, blocking."""
        raise NotImplementedError(f"{type(self).__name__} is called with call()")

    @property
    def batched(self) -> bool:
        """Whether it takes a record's waiting events together (:meth:`call_batch`)."""
        return self.batch > 1

    async def call_batch(
        self, events: list[Event], context: Context, blocking: Blocking
    ) -> Outcome:
        """Call the destination once for consecutive events of one record (``batch`` > 1):
        the outcome is theirs, all of them."""
        raise NotImplementedError(f"{type(self).__name__} takes one event at a time")

    @abstractmethod
    def describe(self, event: Event, context: Context) -> dict[str, Any]:
        """The request, as a dead-letter row shows it (no secrets)."""

    def close(self) -> None:  # noqa: B027 -- most destinations hold nothing
        """Release what the destination holds (connections)."""

    async def aclose(self) -> None:
        """Release what the destination holds, on the lanes' loop when they stop."""
        self.close()


def open_destinations(
    sources: Sources, max_attempts: int = 3, environ: Mapping[str, str] | None = None
) -> dict[str, Destination]:
    """Every destination of ``sources`` plus one per registered task, ready to call;
    ``ConfigError`` says clearly what cannot work (an unknown task, a missing secret, a
    table without the columns it names)."""
    from .http_forward import HttpForward
    from .task import TaskDestination, task_destinations
    from .to_resource import ResourceDestination

    env = dict(os.environ if environ is None else environ)
    configs = sources.destinations
    out: dict[str, Destination] = {}
    for config in [*task_destinations(configs), *configs.values()]:
        if config.kind == "task":
            out[config.name] = TaskDestination(config)
            continue
        config.check_environment(env)
        if config.versioned:
            out[config.name] = ResourceDestination(config, sources, max_attempts, env)
        else:
            out[config.name] = HttpForward(config, env)
    for source in sources.all():
        found = out.get(source.destination_name or "") if source.task else None
        if found is None:
            continue
        if source.also and not found.merges:
            raise ConfigError(
                f"source {source.name}: also names identities, but task {source.task} has no "
                "on_merge to merge two of its records where they are; register it with "
                "@keylane.task(..., on_merge=...)"
            )
        if (source.batch or 1) > 1 and not found.batched:
            raise ConfigError(
                f"source {source.name}: batch = {source.batch}, but task {source.task} takes "
                f"one event at a time; register it with @keylane.task(..., batch=N)"
            )
        if found.batched and source.batch is None:
            logging.getLogger("keylane.destinations").warning(
                "source %s: task %s takes batches, but the source sets no batch: its events "
                "reach the task one at a time (set batch = %s on the source)",
                source.name,
                source.task,
                found.batch,
            )
    return out

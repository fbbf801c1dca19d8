"""Destinations: where a lane sends an event instead of (or besides) keylane's own records.

One interface, one file per implementation, each the only file that imports its client
library:

* :mod:`keylane.workers.destinations.task` runs a registered user task;
* :mod:`keylane.workers.destinations.http_forward` POSTs the event to a URL (httpx).

A destination is given, per event, the event and a :class:`Context` (the idempotency key,
stable across every retry and redelivery of the event; the attempt number; the deadline;
a logger bound to the event) and ends in one :class:`Outcome`:

* :class:`Done` — the effect happened; keylane journals it;
* :class:`RetryLater` — not now: the event waits *in place* (its record's later events
  wait behind it) for a delay, a ``Retry-After``, or exponential back-off;
* :class:`Conflict` — run again from a fresh read, at most ``max_attempts`` times;
* :class:`GiveUp` — a dead-letter row with the reason.

Outcomes may be returned or raised. Anything else raised is an error of the call: it is
retried with back-off and then dead-lettered, as a handler's errors are.
"""

from __future__ import annotations

import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from keylane.routing.contract.destinations import DestinationConfig
from keylane.routing.contract.events import Event


class Outcome(Exception):
    """How a call to a destination ended. ``status`` and ``response`` describe the
    destination's answer (an HTTP status and an excerpt of its body), when there is one."""

    def __init__(self, detail: str = "", status: int | None = None, response: str = "") -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.response = response


class Done(Outcome):
    """The effect happened."""


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
    """This event cannot succeed: make it a dead letter with ``detail`` as the reason."""


@dataclass(frozen=True)
class Context:
    """What a destination is given besides the event."""

    idempotency_key: str
    attempt: int  # 1 on the first call of this event; grows with every retry and redelivery
    deadline: float  # time.time() by which the call should have ended
    log: logging.Logger | logging.LoggerAdapter[logging.Logger]
    destination: str

    @property
    def remaining_s(self) -> float:
        """Seconds left until the deadline (0 when past it)."""
        return max(0.0, self.deadline - time.time())


class Destination(ABC):
    """One configured destination."""

    #: The dead-letter reason of a :class:`GiveUp`.
    give_up_reason = "gave_up"

    def __init__(self, config: DestinationConfig) -> None:
        self.config = config

    @abstractmethod
    def deliver(self, event: Event, context: Context) -> Outcome:
        """Call the destination once for ``event``."""

    @abstractmethod
    def describe(self, event: Event, context: Context) -> dict[str, Any]:
        """The request, as a dead-letter row shows it (no secrets)."""

    def close(self) -> None:  # noqa: B027 -- most destinations hold nothing
        """Release what the destination holds (connections)."""


def open_destinations(
    configs: Mapping[str, DestinationConfig], environ: Mapping[str, str] | None = None
) -> dict[str, Destination]:
    """Every destination of ``configs`` plus one per registered task, ready to call;
    ``ConfigError`` says clearly what cannot work (an unknown task, a missing secret)."""
    from keylane.workers.destinations.http_forward import HttpForward
    from keylane.workers.destinations.task import TaskDestination, task_destinations

    env = dict(os.environ if environ is None else environ)
    out: dict[str, Destination] = {}
    for config in [*task_destinations(configs), *configs.values()]:
        if config.kind == "task":
            out[config.name] = TaskDestination(config)
        else:
            config.check_environment(env)
            out[config.name] = HttpForward(config, env)
    return out

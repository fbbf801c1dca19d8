"""Sending an event to its destination from a lane: flow control, the call, the outcome.

The write discipline for destinations keylane cannot version (a user's task, an HTTP
forward): the journal in keylane's store is the record of outcomes. An event already in
the journal is not sent again; a call that succeeded is journaled, fenced like any write.
A crash between the call and its journal entry repeats the call, with the same
``Idempotency-Key``: exactly once for a destination that honours the key, at least once
for one that does not.

Waiting never holds a lane: when a call must wait (the destination is paused by a
``Retry-After``, at its in-flight or rate limit, or the event backs off after a failure)
the dispatcher answers :class:`Wait` and the lane leaves the message in its shard's
in-flight slot (the record's order holds), takes back its delivery count, backs off only
that shard and serves other shards meanwhile. Failed calls are counted apart from
deliveries, against the destination's ``retry_for_s``, so an outage is waited out rather
than turned into poison.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Any

from keylane.routing.contract.destinations import DestinationConfig, retry_delay_s
from keylane.routing.contract.errors import AlreadyApplied
from keylane.routing.contract.events import Event
from keylane.routing.contract.faults import NO_FAULTS, Faults
from keylane.routing.contract.settings import Settings
from keylane.routing.keys import message_digest
from keylane.workers.apply import ApplyResult, dead_letter, event_write
from keylane.workers.blocking import BlockingPool
from keylane.workers.destinations import (
    Conflict,
    Context,
    Destination,
    Done,
    GiveUp,
    Outcome,
    RetryLater,
)
from keylane.workers.gateway import LaneGateway, Taken
from keylane.workers.stores.base import Fence, JournalEntry, Store

log = logging.getLogger("keylane.dispatch")

#: Kept beyond a destination's time-out before its in-flight slot expires by itself.
SLOT_MARGIN_MS = 5000


@dataclass(frozen=True)
class Wait:
    """Not now: leave the message in flight and come back in ``seconds``."""

    seconds: float
    reason: str


class Dispatcher:
    """Runs events through their destinations (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        gateway: LaneGateway,
        destinations: dict[str, Destination],
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.settings = settings
        self.gateway = gateway
        self.destinations = destinations
        self.faults = faults

    async def deliver(
        self, io: BlockingPool, fence: Fence, taken: Taken, event: Event
    ) -> ApplyResult | Wait:
        """Send ``event`` once to its destination, or say how long to wait."""
        destination = self.destinations.get(event.destination or "")
        if destination is None:
            error = f"no destination named {event.destination!r} on this worker"
            return await io.store(dead_letter, event, fence, "unknown_destination", 1, error)
        entry = await io.store(_journal_entry, event)
        if entry is not None and not (event.retry_of and entry.outcome == "dead_lettered"):
            return ApplyResult("duplicate")
        config = destination.config
        slot = f"{taken.shard}:{message_digest(taken.raw)}"
        gateway = self.gateway
        retries = await io.call(gateway.retries, taken.shard, taken.raw)
        first_attempt = retries + taken.deliveries
        notes = await io.call(self._write_notes, config, taken)
        for rerun in range(self.settings.max_attempts):
            wait_s, why = await io.call(
                gateway.flow.acquire,
                config.name,
                slot,
                config.max_in_flight,
                config.rate_per_s,
                int(config.timeout_s * 1000) + SLOT_MARGIN_MS,
            )
            if wait_s > 0:
                return Wait(wait_s, why)
            context = Context(
                idempotency_key=event.idempotency_key,
                attempt=first_attempt + rerun,
                deadline=time.time() + config.timeout_s,
                log=logging.getLogger(f"keylane.destination.{config.name}"),
                destination=config.name,
                **notes,
            )
            outcome = await self._call(io, destination, slot, event, context)
            # A crash here: the call had its effect, the journal does not know it yet.
            if self.faults:
                await io.call(self.faults.hit, "destination.after_call", event.record_key)
            if not isinstance(outcome, Conflict):
                return await self._settle(io, fence, taken, event, destination, context, outcome)
            log.info("conflict at %s (%s): running again", config.name, outcome.detail)
            if config.versioned:
                notes = await io.call(self._write_notes, config, taken)
        return await io.store(
            dead_letter,
            event,
            fence,
            "conflict",
            self.settings.max_attempts,
            f"{config.name} reported a conflict on each of {self.settings.max_attempts} runs",
            conflicts=self.settings.max_attempts,
        )

    def _write_notes(self, config: DestinationConfig, taken: Taken) -> dict[str, Any]:
        """For a version-checked destination: the write an earlier delivery left in doubt,
        and how to note the next one (kept with the message's delivery count)."""
        if not config.versioned:
            return {}
        shard, raw = taken.shard, taken.raw
        return {
            "write_in_doubt": self.gateway.noted_write(shard, raw),
            "note_write": lambda condition: self.gateway.note_write(shard, raw, condition),
        }

    async def _call(
        self, io: BlockingPool, destination: Destination, slot: str, event: Event, ctx: Context
    ) -> Outcome:
        name = destination.config.name
        try:
            outcome = await destination.call(event, ctx, io.call)
        except Exception:
            await io.call(self.gateway.flow.release, name, slot, "failed")
            raise
        pause_s = 0.0
        if isinstance(outcome, RetryLater) and outcome.pause_destination:
            pause_s = outcome.delay_s or 0.0
        await io.call(self.gateway.flow.release, name, slot, _counter(outcome), pause_s)
        return outcome

    async def _settle(
        self,
        io: BlockingPool,
        fence: Fence,
        taken: Taken,
        event: Event,
        destination: Destination,
        ctx: Context,
        outcome: Outcome,
    ) -> ApplyResult | Wait:
        if isinstance(outcome, Done):
            return await io.store(_journal, fence, event, ctx, outcome)
        if isinstance(outcome, GiveUp):
            reason = outcome.reason or destination.give_up_reason
            error = describe_failure(destination, event, ctx, outcome, f"{reason} after")
            return await io.store(
                dead_letter,
                event,
                fence,
                reason,
                ctx.attempt,
                error,
                outcome.revision_read,
                outcome.revision_found,
            )
        assert isinstance(outcome, RetryLater)
        config = destination.config
        retries, failing_s = await io.call(self.gateway.note_retry, taken.shard, taken.raw)
        if failing_s >= config.retry_for_s:
            error = describe_failure(
                destination, event, ctx, outcome, f"still failing after {failing_s:.0f}s and"
            )
            return await io.store(
                dead_letter, event, fence, "retries_exhausted", ctx.attempt, error
            )
        delay_s = outcome.delay_s
        if delay_s is None:
            delay_s = retry_delay_s(retries, config.max_backoff_s, random.random())
        log.info("%s: %s; calling again in %.1fs", config.name, outcome.detail, delay_s)
        return Wait(delay_s, "retry")

    async def aclose(self) -> None:
        """Close every destination (on the lanes' loop, as they stop)."""
        for destination in self.destinations.values():
            try:
                await destination.aclose()
            except Exception as exc:
                log.debug("closing %s: %s", destination.config.name, exc)


def _journal_entry(store: Store, event: Event) -> JournalEntry | None:
    return store.journal(event.source, event.event_id)


def _journal(store: Store, fence: Fence, event: Event, ctx: Context, done: Done) -> ApplyResult:
    try:
        store.commit_event(event_write(event, None, 0, ctx.attempt), fence)
    except AlreadyApplied:
        return ApplyResult("duplicate", attempts=ctx.attempt)
    ctx.log.info("delivered to %s%s", ctx.destination, f": {done.detail}" if done.detail else "")
    return ApplyResult("applied", attempts=ctx.attempt)


def _counter(outcome: Outcome) -> str:
    return {Done: "done", RetryLater: "retried", Conflict: "conflicts", GiveUp: "gave_up"}.get(
        type(outcome), "done"
    )


def describe_failure(
    destination: Destination, event: Event, ctx: Context, outcome: Outcome, what: str
) -> str:
    """The text of a destination's dead letter: what was sent, what came back."""
    request = destination.describe(event, ctx)
    target = request.get("url") or (
        f"task {request['task']}" if "task" in request else f"the record in {request['resource']}"
    )
    lines = [f"{destination.config.name}: {outcome.detail or type(outcome).__name__}"]
    lines.append(f"{what} {ctx.attempt} call(s) to {target}")
    if outcome.response:
        lines.append(f"response: {outcome.response}")
    return "\n".join(lines)

"""Sending an event to its destination from a lane: flow control, the call, the outcome.

The write discipline for destinations keylane cannot version (a user's task, an HTTP
forward): the journal in keylane's store is the record of outcomes. An event already in
the journal is not sent again; a call that succeeded is journaled, fenced like any write.
A crash between the call and its journal entry repeats the call, with the same
``Idempotency-Key``: exactly once for a destination that honours the key, at least once
for one that does not.

Waiting never holds a lane: when a call must wait (the destination is paused by a
``Retry-After``, at its in-flight or rate limit, or the event backs off after a failure)
the dispatcher answers :class:`Wait` and the lane hands the record back to the broker to
be due again later (its message stays at the head of its list, so the record's order
holds), takes back its delivery count, and serves other records meanwhile: only that
record waits. Failed calls are counted apart from
deliveries, against the destination's ``retry_for_s``, so an outage is waited out rather
than turned into poison.

A batch task is called once for a record's waiting events (taken together by the lane):
one flow-control slot, one call, and its outcome is theirs — each journaled, or each a
dead letter. A batch that must wait is taken together again (:attr:`Wait.batch`: its
delivery counts are forgotten), with any event of the record that arrived meanwhile.
With a debounce, a batch that is not full waits until its newest event
is ``debounce_s`` old. Its idempotency key is its one event's, or, for several, one
derived from all of theirs (a crash between the call and the journal sends its events
again one by one: at least once, whatever the task does with the keys).
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

from ..routing.contract.destinations import DestinationConfig, retry_delay_s
from ..routing.contract.events import Event
from ..routing.contract.faults import NO_FAULTS, Faults
from ..routing.contract.logcontext import event_context
from ..routing.contract.settings import Settings
from ..routing.contract.sources import Sources
from ..routing.redis_keys import message_digest
from . import merges
from .blocking import BlockingPool
from .broker import MessageNotes, Taken
from .dead_letters import Failure
from .destinations import (
    Conflict,
    Context,
    Destination,
    Done,
    GiveUp,
    Outcome,
    Refuse,
    RetryLater,
)
from .flow import DestinationFlow
from .lane_store import LaneStore
from .results import ApplyResult
from .store_rows import Fence
from .stores.dialect import dump_json

log = logging.getLogger("keylane.dispatch")

#: Kept beyond a destination's time-out before its in-flight slot expires by itself.
SLOT_MARGIN_MS = 5000


@dataclass(frozen=True)
class Wait:
    """Not now: the record waits ``seconds`` from ``since`` (``time.monotonic()``: when
    the destination answered, or when the wait was decided; ``batch``: its messages are
    taken together again); ``reason`` and ``detail`` say why and ``attempts`` how many
    calls were made so far (status shows them)."""

    seconds: float
    reason: str
    batch: bool = False
    detail: str = ""
    attempts: int | None = None
    since: float = field(default_factory=time.monotonic)


class Dispatcher:
    """Runs events through their destinations (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        broker: MessageNotes,
        flow: DestinationFlow,
        destinations: dict[str, Destination],
        faults: Faults = NO_FAULTS,
        sources: Sources | None = None,
    ) -> None:
        self.settings = settings
        self.sources = sources  # for a source's on_refusal
        self.broker = broker
        self.flow = flow
        self.destinations = destinations
        self.faults = faults

    def batch_limit(self, name: str) -> int:
        """How many of a record's waiting events the destination ``name`` takes at once."""
        destination = self.destinations.get(name)
        return 1 if destination is None else destination.batch

    async def send(
        self, store: LaneStore, fence: Fence, taken: Taken, events: list[Event]
    ) -> list[ApplyResult] | Wait:
        """Send ``events`` (one, or a batch task's batch: consecutive events of one
        record) once to their destination, or say how long to wait. The results are those
        of the first events, in order (fewer than given: the rest go again one by one).
        For a task that merges, with the merges their identities propose; an event whose
        key was merged goes on to its survivor's lane instead (:mod:`.merges`)."""
        event = events[0]
        destination = self.destinations.get(event.destination or "")
        if destination is None:
            error = f"no destination named {event.destination!r} on this worker"
            failure = Failure("unknown_destination", 1, error)
            return [await store.dead_letter(event, fence, failure)]
        results = await self._send(store, fence, taken, events, destination)
        if isinstance(results, Wait) or not destination.merges:
            return results
        return await merges.with_proposals(store, events, results, self.settings.shards)

    async def _send(
        self,
        store: LaneStore,
        fence: Fence,
        taken: Taken,
        events: list[Event],
        destination: Destination,
    ) -> list[ApplyResult] | Wait:
        event = events[0]
        io = store.io
        entries = await store.journal(events)
        entry = entries[0]
        if entry is not None and not (event.retry_of and entry.outcome == "dead_lettered"):
            return [ApplyResult("duplicate")]
        if destination.merges:  # the key's row: merged into another, its lane takes them
            record = await store.read(event.record_key)
            if record.merged_into is not None:
                return merges.forward(events, record, self.settings.shards)
        events = events[: next((n for n, e in enumerate(entries) if n and e), len(events))]
        config = destination.config
        slot = f"{taken.shard}:{message_digest(taken.raw)}"
        broker = self.broker
        debounce_s = events[-1].accepted_at + destination.debounce_s - time.time()
        first_delivery = taken.deliveries == 1
        if first_delivery and len(events) < destination.batch and debounce_s > 0:
            return Wait(debounce_s, "debounce", batch=True)
        retries = await io.call(broker.retries, taken.shard, taken.raw)
        first_attempt = retries + taken.deliveries
        notes = await io.call(self._write_notes, config, taken)
        for rerun in range(self.settings.max_attempts):
            wait_s, why = await io.call(
                self.flow.acquire,
                config.name,
                slot,
                config.max_in_flight,
                config.rate_per_s,
                _slot_ttl_ms(config),
                config.adaptive,
            )
            if wait_s > 0:
                return Wait(wait_s, why, batch=destination.batched)
            context = Context(
                idempotency_key=_idempotency_key(events),
                attempt=first_attempt + rerun,
                deadline=time.time() + config.timeout_s,
                log=logging.getLogger(f"keylane.destination.{config.name}"),
                destination=config.name,
                **notes,
            )
            # The call's log lines (the task's own among them) carry the attempt it is
            # told, counting its retries, not only the message's deliveries.
            with event_context(attempt=context.attempt):
                outcome, answered = await self._call(io, destination, slot, events, context)
                # A crash here: the call had its effect, the journal does not know it yet.
                if self.faults:
                    point = "merge.called" if event.merge else "destination.after_call"
                    await io.call(self.faults.hit, point, event.record_key)
                if not isinstance(outcome, Conflict):
                    return await self._settle(
                        store, fence, taken, events, destination, context, outcome, answered
                    )
            log.info("conflict at %s (%s): running again", config.name, outcome.detail)
            if config.versioned:
                notes = await io.call(self._write_notes, config, taken)
        runs = self.settings.max_attempts
        error = f"{config.name} reported a conflict on each of {runs} runs"
        return await store.dead_letters(
            events, fence, Failure("conflict", runs, error, conflicts=runs)
        )

    def _write_notes(self, config: DestinationConfig, taken: Taken) -> dict[str, Any]:
        """For a version-checked destination: the write an earlier delivery left in doubt,
        and how to note the next one (kept with the message's delivery count)."""
        if not config.versioned:
            return {}
        shard, raw = taken.shard, taken.raw
        return {
            "write_in_doubt": self.broker.noted_write(shard, raw),
            "note_write": lambda condition: self.broker.note_write(shard, raw, condition),
        }

    async def _call(
        self,
        io: BlockingPool,
        destination: Destination,
        slot: str,
        events: list[Event],
        ctx: Context,
    ) -> tuple[Outcome, float]:
        """The call's outcome, and when it came (``time.monotonic()``): a wait it asks
        for counts from then."""
        config = destination.config
        try:
            if destination.batched and events[0].merge is None:
                outcome = await destination.call_batch(events, ctx, io.call)
            else:
                outcome = await destination.call(events[0], ctx, io.call)
            answered = time.monotonic()
        except Exception:
            await io.call(
                self.flow.release, config.name, slot, "failed", 0, False, _slot_ttl_ms(config)
            )
            raise
        pause_s = 0.0
        if isinstance(outcome, RetryLater) and outcome.pause_destination:
            pause_s = outcome.delay_s or 0.0
        rate = await io.call(
            self.flow.release,
            config.name,
            slot,
            _counter(outcome),
            pause_s,
            _throttled(outcome),
            _slot_ttl_ms(config),
            config.adaptive,
        )
        if rate is not None:
            log.info("%s: %s; calls to it slowed to %.2f/s", config.name, outcome.detail, rate)
        return outcome, answered

    async def _settle(
        self,
        store: LaneStore,
        fence: Fence,
        taken: Taken,
        events: list[Event],
        destination: Destination,
        ctx: Context,
        outcome: Outcome,
        answered: float,
    ) -> list[ApplyResult] | Wait:
        if isinstance(outcome, Done):
            what = f"{len(events)} events" if len(events) > 1 else "delivered"
            detail = f": {outcome.detail}" if outcome.detail else ""
            ctx.log.info("%s to %s%s", what, ctx.destination, detail)
            result = capped_result(outcome.result, self.settings.result_max_bytes)
            return await store.journal_delivered(
                events, fence, ctx.attempt, result=result, keeps_keys=_kept_by(destination)
            )
        if isinstance(outcome, Refuse):
            ctx.log.info("refused by %s: %s", ctx.destination, outcome.reason)
            result = capped_result(outcome.result, self.settings.result_max_bytes)
            source = None if self.sources is None else self.sources.get(events[0].source)
            if source is not None and source.on_refusal == "review":
                return await store.journal_refused_with_review(
                    events, fence, ctx.attempt, result, outcome.reason, _kept_by(destination)
                )
            return await store.journal_delivered(
                events, fence, ctx.attempt, "refused", result, outcome.reason, _kept_by(destination)
            )
        if isinstance(outcome, GiveUp):
            reason = outcome.reason or destination.give_up_reason
            error = describe_failure(destination, events, ctx, outcome, f"{reason} after")
            failure = Failure(
                reason, ctx.attempt, error, outcome.revision_read, outcome.revision_found
            )
            return await store.dead_letters(events, fence, failure)
        assert isinstance(outcome, RetryLater)
        config = destination.config
        retries, failing_s = await store.io.call(self.broker.note_retry, taken.shard, taken.raw)
        if failing_s >= config.retry_for_s:
            error = describe_failure(
                destination, events, ctx, outcome, f"still failing after {failing_s:.0f}s and"
            )
            failure = Failure("retries_exhausted", ctx.attempt, error)
            return await store.dead_letters(events, fence, failure)
        delay_s = outcome.delay_s
        if delay_s is None:
            delay_s = retry_delay_s(retries, config.max_backoff_s, random.random())
        log.info("%s: %s; calling again in %.1fs", config.name, outcome.detail, delay_s)
        return Wait(
            delay_s,
            "retry",
            batch=destination.batched,
            detail=outcome.detail,
            attempts=ctx.attempt,
            since=answered,
        )

    async def aclose(self) -> None:
        """Close every destination (on the lanes' loop, as they stop)."""
        for destination in self.destinations.values():
            try:
                await destination.aclose()
            except Exception as exc:
                log.debug("closing %s: %s", destination.config.name, exc)


def capped_result(result: dict[str, Any] | None, max_bytes: int) -> dict[str, Any] | None:
    """``result`` as its journal entry keeps it: itself when it is JSON of at most
    ``max_bytes``; else a note saying why it was dropped (the effect still happened)."""
    if result is None:
        return None
    try:
        size = len(dump_json(result).encode())
    except (TypeError, ValueError) as exc:
        return {"dropped": "not_json", "error": str(exc)[:200]}
    if size > max_bytes:
        return {"dropped": "result_too_large", "bytes": size, "max_bytes": max_bytes}
    return result


def _kept_by(destination: Destination) -> str | None:
    """The task whose keys keylane keeps rows of (one that merges), by its destination."""
    return destination.config.name if destination.merges else None


def _throttled(outcome: Outcome) -> bool:
    """Whether the destination said "slower": a 429, or a wait it asked every caller for
    (a Retry-After, a task's ``RetryLater(pause_destination=True)``)."""
    paused = isinstance(outcome, RetryLater) and outcome.pause_destination
    return paused or outcome.status == 429


def _slot_ttl_ms(config: DestinationConfig) -> int:
    """How long a call's flow-control slot lives: past the call's time-out, then it frees
    itself (its worker died mid-call)."""
    return int(config.timeout_s * 1000) + SLOT_MARGIN_MS


def _idempotency_key(events: list[Event]) -> str:
    """The key of one call: its one event's, or one derived from each of the batch's."""
    if len(events) == 1:
        return events[0].idempotency_key
    joined = "\n".join(e.idempotency_key for e in events)
    return f"batch-{hashlib.sha256(joined.encode()).hexdigest()[:32]}"


def _counter(outcome: Outcome) -> str:
    return {Done: "done", RetryLater: "retried", Conflict: "conflicts", GiveUp: "gave_up"}.get(
        type(outcome), "done"
    )


def describe_failure(
    destination: Destination, events: list[Event], ctx: Context, outcome: Outcome, what: str
) -> str:
    """The text of a destination's dead letter: what was sent, what came back."""
    request = destination.describe(events[0], ctx)
    lines = [f"{destination.config.name}: {outcome.detail or type(outcome).__name__}"]
    if "resource" in request and isinstance(outcome, GiveUp):
        # A version-checked destination's review says itself what was read, written and
        # found (a change refused for a field it does not own was never sent at all).
        return "\n".join(lines)
    target = request.get("url") or (
        f"task {request['task']}" if "task" in request else f"the record in {request['resource']}"
    )
    batch = f" (one call for {len(events)} events of the record)" if len(events) > 1 else ""
    lines.append(f"{what} {ctx.attempt} call(s) to {target}{batch}")
    if outcome.response:
        lines.append(f"response: {outcome.response}")
    return "\n".join(lines)

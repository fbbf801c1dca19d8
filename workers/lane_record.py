"""What a lane does with one record it was handed: read it, apply its next message (or a
batch of its waiting messages) through the source's handler, its task or its destination,
and acknowledge the outcome in the same broker call as it takes the shard's next record
(:mod:`keylane.workers.lanes` hands records out and runs the lanes; the broker calls that
end a lane's turn on a record, the acknowledgement, a wait, a park, are in
:mod:`keylane.workers.lane_finish`).

What a lane does with a record it cannot finish now. Each holds only that record; its
shard-mates go on, and its own later events wait behind it, in order:

* store or broker unavailable: the record waits a moment (its delivery not counted);
* lease lost or fence refused: drop the shard, leave the record for the next owner;
* handler raised: count the delivery, the record backs off (exponentially), then tries
  again; after ``max_deliveries`` starts (crashes included) the event becomes a
  ``handler_error`` or ``poison`` dead letter and the record moves on;
* bytes that are not a keylane message: a ``malformed`` dead letter, and move on;
* a destination that must wait (paused by a ``Retry-After``, at its limits, a back-off
  after a failed call, a debounce): the record waits until then, its delivery not counted
  (:mod:`keylane.workers.dispatch`);
* a dead letter of a source whose policy is ``hold``: the record is held until the dead
  letter is retried, resolved or discarded (its later events wait in its list).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any, Protocol

import sentry_sdk
from pydantic import ValidationError

from ..routing.contract.destinations import EXCERPT_CHARS, retry_delay_s
from ..routing.contract.errors import (
    BrokerUnavailable,
    MalformedMessage,
    StaleFence,
    StoreUnavailable,
)
from ..routing.contract.events import Event
from ..routing.contract.faults import Faults
from ..routing.contract.logcontext import event_context
from ..routing.contract.message import build_event_message, parse_message
from ..routing.contract.settings import Settings
from ..routing.contract.sources import SourceConfig, Sources
from ..routing.contract.wire import READS, version_of
from ..routing.router import EVENT_TASKS
from . import dead_letters, lane_tells
from .apply import SourceHandler, apply_events, load_source_handler
from .apply_rules import ApplyRules
from .blocking import BlockingPool
from .broker import Ack, Counts, Idle, Lease, MessageNotes, Outgoing, RecordQueue, Taken, Tell
from .dead_letters import Failure
from .dispatch import Dispatcher, Wait
from .doorbell import Doorbell
from .lane_finish import RecordFinish
from .lane_steps import Queued, Step, backlog_source, followers, read_taken
from .lane_store import LaneStore
from .ownership import Ownership
from .results import ApplyResult
from .store import RecordStore
from .store_rows import Fence, Record

log = logging.getLogger("keylane.lanes")


class LaneEvents(Protocol):
    """What the lanes report of each event as they go (Celery task events for Flower, see
    :class:`keylane.workers.worker.TaskEvents`): best effort, never in a lane's way."""

    def started(self, task_id: str, event: Event, attempt: int) -> None:
        """A lane took the event (``attempt``: its delivery count)."""

    def waiting(
        self, task_id: str, event: Event, reason: str, detail: str, delay_s: float, attempts: int
    ) -> None:
        """The event's record waits ``delay_s`` (a back-off, a limit, a debounce): why, and
        how many attempts (calls or deliveries) were made so far."""

    def finished(self, task_id: str, event: Event, result: ApplyResult, runtime_s: float) -> None:
        """The event's outcome is committed and acknowledged."""


#: The longest back-off of a record whose handler keeps failing (its deliveries count).
MAX_BACKOFF_S = 5.0
#: How long a record waits when the store or the broker cannot be reached.
OUTAGE_WAIT_S = 1.0


class RecordLane:
    """A lane's work on one record (see the module docstring): the lanes' loop
    (:class:`keylane.workers.lanes.Lanes`) takes a record, then hands it to
    :meth:`handle`. The broker's two roles it uses: ``queue`` (take and send here;
    finish and wait through ``finish``, a :class:`RecordFinish`) and ``notes`` (why a
    delivery failed)."""

    def __init__(
        self,
        settings: Settings,
        queue: RecordQueue,
        notes: MessageNotes,
        ownership: Ownership,
        sources: Sources,
        faults: Faults,
        dispatcher: Dispatcher,
        io: BlockingPool,
        doorbell: Doorbell,
        stopping: threading.Event,
        events: LaneEvents | None = None,
    ) -> None:
        self.settings = settings
        self.queue = queue
        self.notes = notes
        self.ownership = ownership
        self.sources = sources
        self.faults = faults
        self.dispatcher = dispatcher
        self.io = io
        self.store = LaneStore(io)
        self.finish = RecordFinish(queue, ownership, io, doorbell)
        #: Set when the worker stops: a lane finishes its record and takes no next one.
        self._stop = stopping
        self._events = events
        self._handlers: dict[str, SourceHandler | None] = {}
        self._rules = ApplyRules(
            settings.max_attempts,
            settings.shards,
            settings.handler_time_limit_ms / 1000,
            faults,
            sources.field_owners(),
        )

    def take(self, store: RecordStore, leases: list[Lease]) -> Step | Idle:
        """(In a pool thread.) Take the first due record of ``leases``' shards and read it
        from the store: one blocking call for both."""
        got = self.queue.take(leases)
        return got if isinstance(got, Idle) else read_taken(store, got)

    async def handle(self, lane: int, lease: Lease, step: Step) -> Step | Idle | None:
        """Handle one record's message (or batch); the next record when it was taken with
        the acknowledgement (:class:`Idle` when the acknowledgement found none due)."""
        taken = step.taken
        try:
            message = step.message or parse_message(taken.raw)
            if message.task_name not in EVENT_TASKS:
                raise MalformedMessage(f"unexpected task {message.task_name!r}")
            version = version_of(message.headers)
            if version not in READS:  # a newer keylane's: parked whole, its record held
                why = (version, taken.record_key)
                await self.finish.park(lease, taken, self.store.unreadable, why, hold=True)
                return None
            event = Event.model_validate(message.kwargs.get("event"))
        except (MalformedMessage, ValidationError, KeyError, TypeError, ValueError) as exc:
            await self.finish.park(lease, taken, self.store.malformed, (str(exc),), hold=False)
            return None
        batch = [Queued(taken.raw, event, message.task_id), *self._followers(taken, event)]
        context: dict[str, Any] = {
            "source": event.source,
            "event_id": event.event_id,
            "record_key": event.record_key,
            "shard": lease.shard,
            "attempt": taken.deliveries,
        }
        if len(batch) > 1:
            context["batch"] = len(batch)
        if self._events is not None:
            for queued in batch:
                self._events.started(queued.task_id, queued.event, taken.deliveries)
        with event_context(**context):
            return await self._apply(lane, lease, taken, batch, step.record)

    def _followers(self, taken: Taken, first: Event) -> list[Queued]:
        """The messages taken behind ``first`` that may be applied (or sent to a batch
        task) together with it: its record's next events, while they parse and the source
        (or the task) still takes that many. The others stay in the record's list, to be
        taken one by one."""
        alone = (first.retry_of, first.review, first.merge)  # each an event of its own
        if not taken.followers or any(part is not None for part in alone):
            return []
        if first.destination is not None:
            limit = self.dispatcher.batch_limit(first.destination)
        else:
            source = self.sources.get(first.source)
            limit = 1 if source is None else source.batch_limit(self.settings)
        return followers(taken, first, limit)

    async def _apply(
        self, lane: int, lease: Lease, taken: Taken, batch: list[Queued], record: Record | None
    ) -> Step | Idle | None:
        """Apply the batch and acknowledge what was done; the shard's next record when the
        lane may go on with it at once (taken and read with the acknowledgement), or
        :class:`Idle` when the acknowledgement looked at the shard and found none due."""
        first = batch[0]
        ref = f"{first.event.source}/{first.event.event_id}"
        started = time.monotonic()
        why: dict[str, Any]
        try:
            results = await self._outcome(lease, taken, batch, record)
        except StaleFence as exc:
            log.warning("write of %s refused, the shard has a newer owner: %s", ref, exc)
            self.ownership.lost(lease, str(exc))
            return None
        except (StoreUnavailable, BrokerUnavailable) as exc:  # not the event's fault
            why = {"reason": "unavailable", "error": str(exc)[:EXCERPT_CHARS]}
            await self._wait(lease, taken, batch, OUTAGE_WAIT_S, why, "uncount")
            raise
        except Exception as exc:
            failed = time.monotonic()
            log.exception("handler error on %s (delivery %s)", ref, taken.deliveries)
            sentry_sdk.capture_exception(exc)
            error = f"{type(exc).__name__}: {exc}"
            await self.io.call(self.notes.note_failure, lease.shard, taken.raw, error)
            delay_s = retry_delay_s(taken.deliveries, MAX_BACKOFF_S, random.random())
            why = {"reason": "handler_error", "error": error[:EXCERPT_CHARS]}
            await self._wait(lease, taken, batch, delay_s, why, "keep", failed)
            return None
        if results is None:
            return None  # the lease ran out before the write: the next owner takes it on
        if isinstance(results, Wait):  # waiting is not a failure
            why = {"reason": results.reason, "error": results.detail}
            if results.attempts is not None:  # calls made, not deliveries
                why["attempts"] = results.attempts
            counts: Counts = "forget" if results.batch else "uncount"
            await self._wait(lease, taken, batch, results.seconds, why, counts, results.since)
            return None
        done = list(zip(batch, results, strict=False))
        acks, hold = [], None
        for queued, result in done:
            hold = await self._after(queued.event, result) or hold
            if self.faults:
                await self.io.call(self.faults.hit, "worker.before_ack", queued.event.record_key)
            applied = result.outcome == "applied"
            latency = max(0.0, time.time() - queued.event.accepted_at) if applied else None
            tell = await self._tell(queued.event, result)
            counted = result.counted_as or result.outcome
            backlog = backlog_source(queued.event)
            acks.append(
                Ack(queued.raw, counted, result.conflicts, result.attempts, latency, tell, backlog)
            )
        keep = not self._stop.is_set() and self.ownership.keep(lane, lease)
        finished = await self.finish.acknowledge(lease, taken, acks, hold, keep)
        if self._events is not None:
            runtime = time.monotonic() - started
            for queued, result in done:
                self._events.finished(queued.task_id, queued.event, result, runtime)
        return finished

    async def _wait(
        self,
        lease: Lease,
        taken: Taken,
        batch: list[Queued],
        delay_s: float,
        why: dict[str, Any],
        counts: Counts,
        since: float | None = None,
    ) -> None:
        """Report the wait of ``batch``'s events, then let ``taken``'s record wait
        (:meth:`RecordFinish.wait`)."""
        why = {"attempts": taken.deliveries, **why}
        if self._events is not None:
            for queued in batch:
                detail = why.get("error") or ""
                attempts = int(why["attempts"])
                self._events.waiting(
                    queued.task_id, queued.event, why["reason"], detail, delay_s, attempts
                )
        await self.finish.wait(lease, taken, delay_s, why, counts, since)

    async def _outcome(
        self, lease: Lease, taken: Taken, batch: list[Queued], record: Record | None
    ) -> list[ApplyResult] | Wait | None:
        fence = Fence(lease.shard, lease.token)
        event = batch[0].event
        deliveries = taken.deliveries
        if deliveries > self.settings.max_deliveries:
            # Started this often without finishing: failing every time (handler_error) or
            # killing its worker every time (poison). Record it and let the record move on.
            last_error = await self.io.call(self.notes.last_failure, lease.shard, taken.raw)
            reason = "handler_error" if last_error else "poison"
            detail = last_error or "the worker died each time (killed, crashed or stuck)"
            error = f"started {deliveries - 1} times without finishing; last: {detail}"
            failure = Failure(reason, deliveries - 1, error)
            return [await self.store.dead_letter(event, fence, failure)]
        if not self.ownership.valid(lease):
            return None
        events = [queued.event for queued in batch]
        if event.destination is not None:
            dispatched = await self.dispatcher.send(self.store, fence, taken, events)
            if isinstance(dispatched, Wait):
                return dispatched
            results = dispatched
        else:
            source = self.sources.get(event.source)
            results = await apply_events(
                self.store, events, fence, source, self._rules, self._handler(source), record
            )
        outgoing = [self._outgoing(sent) for result in results for sent in result.sends]
        if outgoing:  # before the acknowledgement: a crash sends them again
            await self.io.call(self.queue.send, outgoing)
            if self.faults:
                await self.io.call(self.faults.hit, "worker.after_send", event.record_key)
        return results

    def _outgoing(self, event: Event) -> Outgoing:
        """``event`` as a message for its record's shard queue, sent once per hop."""
        queue = self.settings.shards.queue_name(event.shard)
        marker = f"{event.source}/{event.event_id}>{event.record_key}"
        return Outgoing(marker, event.shard, event.record_key, build_event_message(event, queue))

    def _handler(self, source: SourceConfig | None) -> SourceHandler | None:
        if source is None:
            return None
        if source.name not in self._handlers:
            self._handlers[source.name] = load_source_handler(source)
        return self._handlers[source.name]

    async def _tell(self, event: Event, result: ApplyResult) -> Tell | None:
        """What to tell with the acknowledgement (:mod:`keylane.workers.lane_tells`): a
        duplicate is told again from the journal. Never in the acknowledgement's way: a
        journal that cannot be read now tells nothing (the waiter gets a 202)."""
        if not lane_tells.tells(event):
            return None
        told = lane_tells.told_of(event, result, time.time())
        if result.outcome == "duplicate":
            try:
                told = await self.io.store(
                    lambda store: lane_tells.journal_told(store, store, event)
                )
            except Exception as exc:
                log.warning("could not read the outcome of a duplicate to tell it: %s", exc)
        return lane_tells.tell_of(told, event, self.settings, self.sources)

    async def _after(self, event: Event, result: ApplyResult) -> int | None:
        """Alert on a new dead letter; the dead letter that holds the record when the
        source's policy is ``hold`` (again, when a crash came before it was held)."""
        source = self.sources.get(event.source)
        holds = source is not None and source.on_dead_letter == "hold"
        if result.outcome == "dead_lettered":
            dead_letters.alert(event, result)
            if holds and result.reason != "id_reused":
                return result.dead_letter_id
        elif result.outcome == "duplicate" and holds and event.review is None:
            return await self.store.open_dead_letter(event)
        return None

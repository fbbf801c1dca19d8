"""Lanes: the threads of a worker process that take shard messages and apply them.

A lane takes one message at a time from a shard this worker owns, into that shard's
in-flight slot (never two of one shard: the take script refuses while the slot is full
and a local mark keeps other lanes of the process off the shard), applies it, and only
then acknowledges it. Several lanes work on different shards at once.

What a lane does with a message it cannot finish:

* store or Redis unavailable: leave it in flight, back off, take it again (order kept);
* lease lost or fence refused: drop the shard, leave the message for the next owner;
* handler raised: count the delivery, back off, try again; after ``max_deliveries``
  starts (crashes included) the event becomes a ``poison`` dead letter and the shard
  moves on;
* bytes that are not a keylane task: a ``malformed`` dead letter, and move on;
* an event for a destination that must wait (throttled, paused, backing off after a
  failed call): leave it in flight, take back its delivery count, back off that shard
  only (:mod:`keylane.workers.dispatch`).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable

import sentry_sdk
from pydantic import ValidationError

from keylane.routing.contract.errors import BrokerUnavailable, StaleFence, StoreUnavailable
from keylane.routing.contract.events import Event
from keylane.routing.contract.faults import Faults
from keylane.routing.contract.logcontext import event_context
from keylane.routing.contract.message import MalformedMessage, parse_message
from keylane.routing.contract.settings import Settings
from keylane.routing.contract.sources import SourceConfig, Sources
from keylane.routing.router import APPLY_TASK, UNHOLD_TASK
from keylane.workers.alerts import alert_dead_letter
from keylane.workers.apply import ApplyResult, Handler, apply_event, dead_letter
from keylane.workers.dispatch import Dispatcher, Wait
from keylane.workers.doorbell import Doorbell
from keylane.workers.gateway import LaneGateway, Lease, Taken
from keylane.workers.ownership import Ownership
from keylane.workers.stores.base import DeadLetterDraft, DeadLetterFilter, Fence, Store

log = logging.getLogger("keylane.lanes")

#: Called after each acknowledged event: (task id, event, result, seconds it took).
ResultCallback = Callable[[str, Event, ApplyResult, float], None]

MAX_BACKOFF_S = 5.0
#: Shards offered to one take: bounds the take script's cost whatever a worker owns.
TAKE_WINDOW = 16


class Lanes:
    """The lane threads of one worker process."""

    def __init__(
        self,
        settings: Settings,
        gateway: LaneGateway,
        ownership: Ownership,
        sources: Sources,
        store_factory: Callable[[], Store],
        faults: Faults,
        on_result: ResultCallback | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.settings = settings
        self.dispatcher = dispatcher or Dispatcher(settings, gateway, {})
        self.gateway = gateway
        self.ownership = ownership
        self.sources = sources
        self.faults = faults
        self._store_factory = store_factory
        self._on_result = on_result
        self._handlers: dict[str, Handler | None] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.doorbell = Doorbell(gateway, ownership.owns)
        # A shard that was just acquired may hold a restored message: look there first.
        ownership.on_acquired = self.doorbell.ring

    def start(self) -> None:
        """Start the doorbell and the lane threads."""
        self.doorbell.start()
        for n in range(self.settings.lanes):
            thread = threading.Thread(target=self._run, name=f"keylane-lane-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Let each lane finish its message, then stop."""
        self._stop.set()
        self.doorbell.stop()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # -- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        # Each lane its own Sentry isolation scope: breadcrumbs and tags of one lane's
        # events never end up on another lane's error.
        with sentry_sdk.isolation_scope():
            self._loop()

    def _loop(self) -> None:
        store: Store | None = None
        idle_s = self.settings.idle_poll_ms / 1000
        while not self._stop.is_set():
            try:
                store = store or self._store_factory()
                if not self._step(store):
                    self.doorbell.wait(idle_s)
            except StoreUnavailable as exc:
                log.warning("store unavailable: %s", exc)
                _close(store)
                store = None
                self._stop.wait(1.0)
            except BrokerUnavailable as exc:
                log.warning("Redis unavailable: %s", exc)
                self._stop.wait(1.0)
            except Exception:
                log.exception("lane error")
                _close(store)
                store = None
                self._stop.wait(1.0)
        _close(store)

    def _step(self, store: Store) -> bool:
        """Take and handle one message; False when there was nothing to take.

        The shards offered to the take script are reserved first (no other lane of this
        process can take from them meanwhile), at most ``TAKE_WINDOW`` at a time: the
        rung ones first, then the others in rotation.
        """
        leases = self.ownership.reserve(self.doorbell.hints(), TAKE_WINDOW)
        if not leases:
            return False
        taken = None
        try:
            taken = self.gateway.take(leases)
        finally:
            for lease in leases:
                if taken is None or lease.shard != taken.shard:
                    self.ownership.end(lease.shard)
        if taken is None:
            return False
        lease = next(lease for lease in leases if lease.shard == taken.shard)
        try:
            self._handle(store, lease, taken)
        finally:
            self.ownership.end(taken.shard)
        self.doorbell.ring(taken.shard)  # where there was one message there may be more
        return True

    def _handle(self, store: Store, lease: Lease, taken: Taken) -> None:
        try:
            message = parse_message(taken.raw)
            if message.task_name == UNHOLD_TASK:
                self._unhold(lease, taken, message.kwargs)
                return
            if message.task_name != APPLY_TASK:
                raise MalformedMessage(f"unexpected task {message.task_name!r}")
            event = Event.model_validate(message.kwargs.get("event"))
        except (MalformedMessage, ValidationError, KeyError, TypeError, ValueError) as exc:
            self._malformed(store, lease, taken, str(exc))
            return
        context = {
            "source": event.source,
            "event_id": event.event_id,
            "record_key": event.record_key,
            "shard": lease.shard,
            "attempt": taken.deliveries,
        }
        with event_context(**context):
            self._route(store, lease, taken, event, message.task_id)

    def _route(self, store: Store, lease: Lease, taken: Taken, event: Event, task_id: str) -> None:
        if taken.any_held or event.retry_of is not None:
            verdict = self.gateway.park(lease, taken.raw, event.record_key, event.retry_of)
            if verdict == "parked":
                log.info(
                    "parked %s/%s: %s is held behind an open dead letter",
                    event.source,
                    event.event_id,
                    event.record_key,
                )
                return
            if verdict == "lost":
                self.ownership.lost(lease, "lease changed before the message could be parked")
                return
        self._apply(store, lease, taken, event, task_id)

    def _unhold(self, lease: Lease, taken: Taken, kwargs: dict[str, object]) -> None:
        record_key = str(kwargs["record_key"])
        dead_letter_id = int(str(kwargs["dead_letter_id"]))
        released = self.gateway.unhold_key(lease, taken.raw, record_key, dead_letter_id)
        if released < 0:
            self.ownership.lost(lease, "lease changed before a release could run")
        else:
            log.info(
                "released %s (dead letter %s): %s parked event(s) go next",
                record_key,
                dead_letter_id,
                released,
            )

    def _apply(self, store: Store, lease: Lease, taken: Taken, event: Event, task_id: str) -> None:
        ref = f"{event.source}/{event.event_id}"
        deliveries = taken.deliveries
        started = time.monotonic()
        try:
            result = self._outcome(store, lease, taken, event)
        except StaleFence as exc:
            log.warning("write of %s refused, the shard has a newer owner: %s", ref, exc)
            self.ownership.lost(lease, str(exc))
            return
        except StoreUnavailable:
            self.gateway.uncount_delivery(lease.shard, taken.raw)  # an outage is not its fault
            self.ownership.back_off(lease.shard, 1.0)
            raise
        except Exception as exc:
            log.exception("handler error on %s (delivery %s)", ref, deliveries)
            sentry_sdk.capture_exception(exc)
            self.gateway.note_failure(lease.shard, taken.raw, f"{type(exc).__name__}: {exc}")
            self.ownership.back_off(lease.shard, min(MAX_BACKOFF_S, 0.05 * 2**deliveries))
            return
        if result is None:
            return  # the lease ran out before the write: the next owner takes it from here
        if isinstance(result, Wait):
            self.gateway.uncount_delivery(lease.shard, taken.raw)  # waiting is not a failure
            self.ownership.back_off(lease.shard, result.seconds)
            return
        self._after(store, event, result)
        self.faults.hit("worker.before_ack", event.record_key)
        applied = result.outcome == "applied"
        latency = max(0.0, time.time() - event.accepted_at) if applied else None
        self.gateway.ack(
            lease, taken.raw, result.outcome, result.conflicts, result.attempts, latency
        )
        if self._on_result is not None:
            self._on_result(task_id, event, result, time.monotonic() - started)

    def _outcome(
        self, store: Store, lease: Lease, taken: Taken, event: Event
    ) -> ApplyResult | Wait | None:
        fence = Fence(lease.shard, lease.token)
        deliveries = taken.deliveries
        if deliveries > self.settings.max_deliveries:
            # Started this often without finishing: failing every time (handler_error) or
            # killing its worker every time (poison). Record it and let the shard move on.
            last_error = self.gateway.last_failure(lease.shard, taken.raw)
            reason = "handler_error" if last_error else "poison"
            detail = last_error or "the worker died each time (killed, crashed or stuck)"
            return dead_letter(
                store,
                event,
                fence,
                reason,
                deliveries - 1,
                f"started {deliveries - 1} times without finishing; last: {detail}",
            )
        if not self.ownership.valid(lease):
            return None
        if event.destination is not None:
            return self.dispatcher.deliver(store, fence, taken, event)
        source = self.sources.get(event.source)
        return apply_event(
            store,
            event,
            fence,
            source,
            self.settings.max_attempts,
            self.faults,
            self._handler(source),
            self.settings.handler_time_limit_ms / 1000,
        )

    def _handler(self, source: SourceConfig | None) -> Handler | None:
        if source is None or source.handler is None:
            return None
        if source.name not in self._handlers:
            self._handlers[source.name] = source.load_handler()
        return self._handlers[source.name]

    def _after(self, store: Store, event: Event, result: ApplyResult) -> None:
        """Alert on a new dead letter and, for a source whose policy is ``hold``, hold
        the record key behind it (again, when a crash came between the two)."""
        source = self.sources.get(event.source)
        holds = source is not None and source.on_dead_letter == "hold"
        if result.outcome == "dead_lettered":
            alert_dead_letter(event, result)
            if holds and result.reason != "id_reused" and result.dead_letter_id is not None:
                self.gateway.hold(event.record_key, result.dead_letter_id)
        elif result.outcome == "duplicate" and holds and event.review is None:
            entry = store.journal(event.source, event.event_id)
            if entry is not None and entry.outcome == "dead_lettered":
                for row in store.dead_letters(
                    DeadLetterFilter(
                        statuses=("open",), sources=(event.source,), record_key=event.record_key
                    )
                ):
                    if row.event_id == event.event_id:
                        self.gateway.hold(event.record_key, row.id)

    def _malformed(self, store: Store, lease: Lease, taken: Taken, error: str) -> None:
        digest = hashlib.sha256(taken.raw).hexdigest()
        draft = DeadLetterDraft(
            source="",
            event_id=f"sha256:{digest}",
            record_key="",
            shard=lease.shard,
            reason="malformed",
            event={"raw": taken.raw[:4096].decode("utf-8", "replace")},
            attempted_change={},
            revision_read=None,
            revision_found=None,
            attempts=1,
            error=error[:2000],
        )
        try:
            store.commit_dead_letter(draft, Fence(lease.shard, lease.token), close_event=False)
        except StaleFence as exc:
            self.ownership.lost(lease, str(exc))
            return
        self.gateway.ack(lease, taken.raw, "dead_lettered")


def _close(store: Store | None) -> None:
    if store is not None:
        try:
            store.close()
        except Exception as exc:
            log.debug("closing store: %s", exc)

"""Events from Python: the producer behind ``task.send(...)``.

An event sent from Python goes through the receiver's own accept script
(:mod:`keylane.producers.gateway`): the same dedupe on the event id (a second send of one
id is a duplicate and changes nothing; the same id with another payload is refused), the
same high-water mark, the same shard queue. The core is async; :meth:`Sender.send` runs it
on the sender's own event-loop thread, so it can be called from any thread.

A send may wait for its event's outcome (``wait=seconds``): it is told as a waiting
``POST`` is (``ops/docs/outcomes.md``), through the same one-subscription waits
(:mod:`keylane.producers.outcome_waits`) on the sender's loop, registered before the
accept so no outcome is told unheard. A change to keylane's records may carry
``conditions`` and ``if_revision``, checked by the receiver's rules
(:mod:`keylane.routing.contract.conditions`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from ..routing.contract.conditions import check_conditions, check_if_revision
from ..routing.contract.errors import BrokerUnavailable, InvalidEvent, LeaseLost
from ..routing.contract.events import wire_changes
from ..routing.contract.outcomes import ToldStatus, decode_told
from ..routing.contract.schedules import RunLease
from ..routing.contract.settings import Settings
from .accept import Acceptor, NewEvent, body_sha256, new_event, payload_body
from .broker import open_event_queue
from .gateway import EnqueueResult
from .intake import keyless_id
from .outcome_waits import OutcomeWaits

SEND_TIMEOUT_S = 30.0

SentStatus = Literal["accepted", "duplicate"] | ToldStatus


@dataclass(frozen=True)
class Sent:
    """What became of a send: ``accepted`` (queued) or ``duplicate`` (this event id was
    sent before with the same payload; nothing was queued). A send that waited
    (``wait=``) and was told its event's outcome in time has that outcome's status
    instead (``applied``, ``refused``, ``dead_lettered``) with its ``revision``,
    ``result``, ``reason`` and ``dead_letter_id``; ``replayed``: told the stored outcome
    of an earlier send of the same id."""

    status: SentStatus
    event_id: str
    record_key: str
    shard: int
    key_missing: bool = False
    revision: int | None = None
    result: dict[str, Any] | None = None
    reason: str | None = None
    dead_letter_id: int | None = None
    replayed: bool = False

    @property
    def decided(self) -> bool:
        """Whether this tells the event's outcome (not only that it was queued)."""
        return self.status not in ("accepted", "duplicate")


class Sender:
    """Sends events into a deployment's shard queues (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="keylane-sender", daemon=True
        )
        self._thread.start()
        self._acceptor: Acceptor | None = None
        self._waits: OutcomeWaits | None = None

    def send(
        self,
        batch: int = 1,
        lease: RunLease | None = None,
        wait: float | None = None,
        **fields: Any,
    ) -> Sent:
        """Queue an event built from ``fields`` (the keyword arguments of
        :meth:`new_event`: source, destination, payload, record_key, event_id,
        event_type, changes, conditions, if_revision, identities), deduplicated on
        ``(source, event_id)`` (no id: a unique one, never a duplicate); ``batch``: how
        many of its record's waiting events a lane may take with it (a batch task's
        limit); ``lease``: a scheduled run's, without which nothing is accepted
        (:class:`LeaseLost`); ``wait``: seconds to wait for the event's outcome (capped by
        ``KEYLANE_OUTCOME_WAIT_MAX_S``), told in the :class:`Sent` returned, else it says
        ``accepted``. Raises :class:`InvalidEvent` for an id reused with another payload,
        :class:`BrokerUnavailable` when Redis or the shard cannot take it now."""
        event = self.new_event(**fields)
        wait_s = self.wait_s(wait)
        coroutine = self._accept(event, batch, lease, wait_s)
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(SEND_TIMEOUT_S + (wait_s or 0))

    async def send_async(
        self,
        batch: int = 1,
        lease: RunLease | None = None,
        wait: float | None = None,
        **fields: Any,
    ) -> Sent:
        """:meth:`send` for async code (the same keyword arguments)."""
        event = self.new_event(**fields)
        coroutine = self._accept(event, batch, lease, self.wait_s(wait))
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return await asyncio.wrap_future(future)

    def wait_s(self, wait: float | None) -> float | None:
        """How long a send asked to wait may wait (None: it does not)."""
        if wait is None:
            return None
        if wait < 0:
            raise InvalidEvent(f"wait must be 0 seconds or more, not {wait!r}")
        return min(float(wait), float(self.settings.outcome_wait_max_s))

    @property
    def waits(self) -> OutcomeWaits:
        """(On the sender's loop.) The sends that wait for their outcomes."""
        if self._waits is None:
            self._waits = OutcomeWaits(self.acceptor.queue.redis.outcome_feed)
        return self._waits

    @property
    def acceptor(self) -> Acceptor:
        """The accept path, connected to Redis on first use."""
        if self._acceptor is None:
            self._acceptor = Acceptor(self.settings, open_event_queue(self.settings))
        return self._acceptor

    def new_event(
        self,
        source: str,
        destination: str | None,
        payload: Any,
        record_key: str,
        event_id: str | None = None,
        event_type: str = "event",
        changes: Mapping[str, Any] | None = None,
        conditions: Mapping[str, Any] | None = None,
        if_revision: int | None = None,
        identities: tuple[str, ...] = (),
    ) -> NewEvent:
        """An event for ``destination`` carrying ``payload``, or (``destination`` None) a
        change to one of keylane's records, which may carry ``conditions`` and
        ``if_revision`` (``InvalidEvent`` if it cannot be: a task checks its own and
        refuses with ``keylane.Refuse``). ``identities`` come normalised
        (``check_identities``)."""
        wire = checked = None
        if (conditions is not None or if_revision is not None) and changes is None:
            raise InvalidEvent(
                "conditions and if_revision go with changes to keylane's records "
                "(a task checks its record itself and raises keylane.Refuse)"
            )
        try:
            if changes is not None:
                wire = wire_changes(dict(changes))
            if conditions is not None:
                checked = check_conditions(dict(conditions))
            if if_revision is not None:
                check_if_revision(if_revision)
        except ValueError as exc:
            raise InvalidEvent(str(exc)) from None
        body = payload_body(
            payload if wire is None else _change_body(wire, payload, checked, if_revision)
        )
        return new_event(
            self.settings.shards,
            source=source,
            event_id=keyless_id() if event_id is None else event_id,
            event_type=event_type,
            record_key=record_key,
            body_sha256=body_sha256(body.encode()),
            key_missing=event_id is None,
            destination=destination,
            changes=wire,
            body=None if wire is not None else body,
            conditions=checked,
            if_revision=if_revision,
            identities=identities,
        )

    async def _accept(
        self, event: NewEvent, batch: int, lease: RunLease | None, wait_s: float | None
    ) -> Sent:
        if wait_s is None:
            return sent_of(await self._enqueue(event, batch, lease), event)
        # Registered (and subscribed) before the accept: an outcome told after it is heard.
        async with self.waits.waiting_for(event.source, event.event_id) as waiter:
            result = await self._enqueue(event, batch, lease)
            sent = sent_of(result, event)
            if result.told is not None:  # decided before: its stored outcome
                return replace(told_sent(sent, result.told), replayed=True)
            told = await waiter.outcome(wait_s)
        return sent if told is None else told_sent(sent, told)

    async def _enqueue(self, event: NewEvent, batch: int, lease: RunLease | None) -> EnqueueResult:
        """Run the accept script; raise for what a send cannot be (fenced, reused, full)."""
        result = await self.acceptor.accept(event, self.settings.dedupe_retention_s, batch, lease)
        if result.verdict == "fenced":
            assert lease is not None
            raise LeaseLost(lease.job, f"event {event.event_id} refused")
        if result.verdict == "reused":
            raise InvalidEvent(
                f"event id {event.event_id!r} was sent before with another payload",
                409,
                "id_reused",
            )
        if result.verdict == "full":
            raise BrokerUnavailable(f"shard {event.shard} is full ({result.detail} waiting)")
        return result

    def close(self) -> None:
        """Close the connection and stop the loop thread."""
        if self._waits is not None:
            asyncio.run_coroutine_threadsafe(self._waits.close(), self._loop).result(5)
        if self._acceptor is not None:
            close = self._acceptor.queue.close()
            asyncio.run_coroutine_threadsafe(close, self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


def sent_of(result: EnqueueResult, event: NewEvent) -> Sent:
    """What the accept script said of a send: queued, or a duplicate."""
    status: Literal["accepted", "duplicate"] = (
        "accepted" if result.verdict == "accepted" else "duplicate"
    )
    return Sent(status, event.event_id, event.record_key, event.shard, event.key_missing)


def told_sent(sent: Sent, body: bytes) -> Sent:
    """``sent`` told its event's outcome (a told body, ``routing/contract/outcomes.py``)."""
    told = decode_told(body)
    return replace(
        sent,
        status=told.status,
        revision=told.revision,
        result=told.result,
        reason=told.reason,
        dead_letter_id=told.dead_letter_id,
    )


def _change_body(
    wire: dict[str, Any], payload: Any, conditions: dict[str, Any] | None, if_revision: int | None
) -> dict[str, Any]:
    """What a change's dedupe digest is taken of: the same id with other conditions is
    another event (a reused id), and a change without any digests as before."""
    body: dict[str, Any] = {"changes": wire, "payload": payload}
    if conditions is not None:
        body["conditions"] = conditions
    if if_revision is not None:
        body["if_revision"] = if_revision
    return body

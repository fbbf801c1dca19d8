"""Accepting an event: the one path from a checked delivery (the receiver) or a send from
Python (``task.send``, :mod:`keylane.producers.sender`) to its record's shard queue.

Both build the event here (:func:`new_event`): its shard and queue, the form its
message carries, and the answer kept with its dedupe mark and replayed to duplicates; and
both hand it to the one accept script (:meth:`Acceptor.accept`, see
:mod:`keylane.producers.gateway`): dedupe, high-water mark and push, in one step.

The event is built directly in the form its message carries (the fields of
:class:`~keylane.routing.contract.events.Event`, as ``Event.model_dump(mode="json")``
writes them and a lane reads them back with ``Event.model_validate``), from parts checked
by the rules in :mod:`keylane.routing.contract.events`: the receiver builds no model on
its way, and ``tests/test_accept.py`` checks that the lane reads back what was built.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import msgspec

from ..routing import ShardMap
from ..routing.contract.errors import InvalidEvent
from ..routing.contract.events import (
    WIRE_DEFAULTS,
    check_event_id,
    check_json_value,
    check_record_key,
    check_text,
)
from ..routing.contract.message import event_message
from ..routing.contract.schedules import RunLease
from ..routing.contract.settings import Settings
from ..routing.contract.wire import for_version
from ..routing.hot_records import hot_record
from .broker import EventQueue
from .gateway import BatchResult, Enqueue, EnqueueResult
from .wire_choice import WireChoice

_ENCODE = msgspec.json.Encoder().encode


@hot_record
class KeptDelivery:
    """The delivery an event came from: its id, and its request when its source keeps
    deliveries (:mod:`keylane.routing.contract.kept_deliveries`). A batched delivery's
    events share one."""

    delivery_id: str
    request: dict[str, Any] | None = None


@hot_record
class NewEvent:
    """An event ready for the accept script."""

    source: str
    event_id: str
    record_key: str
    shard: int
    queue: str
    key_missing: bool
    body_sha256: str
    #: The event as its message carries it (see the module docstring).
    wire: dict[str, Any]
    #: The 202 answer's body: kept with the dedupe mark, replayed to duplicates.
    answer: bytes


def new_event(
    shards: ShardMap,
    *,
    source: str,
    event_id: str,
    event_type: str,
    record_key: str,
    body_sha256: str,
    changes: dict[str, dict[str, Any]] | None = None,
    key_missing: bool = False,
    destination: str | None = None,
    body: str | None = None,
    conditions: dict[str, dict[str, Any]] | None = None,
    if_revision: int | None = None,
    identities: tuple[str, ...] = (),
    delivery: str | None = None,
    request: dict[str, Any] | None = None,
) -> NewEvent:
    """The event to accept; :class:`InvalidEvent` if an id, key or type cannot be
    stored. ``changes`` and ``conditions`` come checked (``wire_changes``,
    ``check_conditions``), ``identities`` normalised (``check_identities``); ``body`` is
    the JSON text a task or destination gets (a lane reads the payload from it)."""
    try:
        check_event_id(event_id)
        check_record_key(record_key)
        check_text(event_type, "the event type")
    except ValueError as exc:
        raise InvalidEvent(str(exc)) from None
    shard = shards.shard_for_key(record_key)
    queue = shards.queue_name(shard)
    wire = {
        **WIRE_DEFAULTS,
        "source": source,
        "event_id": event_id,
        "event_type": event_type,
        "record_key": record_key,
        "changes": changes or {},
        "body_sha256": body_sha256,
        "accepted_at": time.time(),
        "shard": shard,
        "key_missing": key_missing,
        "destination": destination,
        "body": body,
        "conditions": conditions,
        "if_revision": if_revision,
        "identities": list(identities),
        "delivery": delivery,
        "request": request,
    }
    answer = accepted_answer(source, event_id, record_key, shard, queue, key_missing)
    return NewEvent(
        source, event_id, record_key, shard, queue, key_missing, body_sha256, wire, answer
    )


def accepted_answer(
    source: str, event_id: str, record_key: str, shard: int, queue: str, key_missing: bool
) -> bytes:
    """The body of the 202 answer (docs: Concepts, "Events and answers",
    ops/docs/concepts.md)."""
    answer: dict[str, Any] = {
        "status": "accepted",
        "source": source,
        "event_id": event_id,
        "record_key": record_key,
        "shard": shard,
        "queue": queue,
    }
    if key_missing:
        answer["key_missing"] = True
    return _ENCODE(answer)


class Acceptor:
    """Hands events to one deployment's event queue."""

    def __init__(self, settings: Settings, queue: EventQueue) -> None:
        self.settings = settings
        self.queue = queue
        self.wire = WireChoice(queue.redis, settings.lease_ttl_ms)

    async def accept(
        self,
        event: NewEvent,
        retention_s: int,
        batch: int = 1,
        lease: RunLease | None = None,
        share: int = 0,
    ) -> EnqueueResult:
        """Run the accept script for ``event``: queued and marked seen for
        ``retention_s``, or a duplicate, a reused id, or a full shard. ``batch``: how
        many of its record's waiting events a lane may take with it (see
        :func:`~keylane.routing.contract.message.event_message`); ``lease``: a scheduled
        run's, which must still hold its job's lease (else ``fenced``, nothing done);
        ``share``: the most events of its source that may wait while another source's do
        (else ``throttled``; 0: no share)."""
        item = _enqueue(event, await self._message(event.wire, event.queue, batch), retention_s)
        return await self.queue.accept(
            replace(
                item,
                answer=event.answer,
                high_water=self.settings.shard_high_water,
                global_high_water=self.settings.global_high_water,
                outcome_keep_ms=self.settings.outcome_keep_s * 1000,
                key_missing=event.key_missing,
                lease=lease,
            ),
            share,
        )

    async def accept_batch(
        self, events: Sequence[NewEvent], retention_s: int, batch: int = 1, share: int = 0
    ) -> BatchResult:
        """:meth:`accept` for every event of one delivery, all or none (a batched
        sender's items: :meth:`EventQueue.accept_batch`)."""
        items = [
            replace(
                _enqueue(event, await self._message(event.wire, event.queue, batch), retention_s),
                answer=event.answer,
                high_water=self.settings.shard_high_water,
                global_high_water=self.settings.global_high_water,
                outcome_keep_ms=self.settings.outcome_keep_s * 1000,
                key_missing=event.key_missing,
            )
            for event in events
        ]
        return await self.queue.accept_batch(items, share=share)

    async def record_reuse(self, event: NewEvent, retention_s: int) -> bool:
        """Queue ``event``, marked for review only, as the record of its id reused with
        another body (once per distinct body: senders retry a 409)."""
        review = {**event.wire, "review": "id_reused"}
        return await self.queue.record_reuse(
            _enqueue(event, await self._message(review, event.queue), retention_s)
        )

    async def _message(self, wire: dict[str, Any], queue: str, batch: int = 1) -> bytes:
        """The message of ``wire`` in the newest wire version every live worker reads;
        :class:`NeedsNewerWire` (a 503) when the event needs a newer one."""
        version = await self.wire.current()
        return event_message(for_version(wire, version, WIRE_DEFAULTS), queue, batch, wire=version)


def _enqueue(event: NewEvent, message: bytes, retention_s: int) -> Enqueue:
    """``message`` for ``event``'s shard queue, its mark kept ``retention_s``."""
    return Enqueue(
        source=event.source,
        event_id=event.event_id,
        body_sha256=event.body_sha256,
        queue=event.queue,
        shard=event.shard,
        message=message,
        record_key=event.record_key,
        retention_ms=retention_s * 1000,
    )


def payload_body(payload: Any) -> str:
    """The JSON text of a payload sent from Python, written one way for one value (keys
    sorted), so that a resend of the same payload is recognised; :class:`InvalidEvent`
    if it is not JSON (NaN and Infinity are not)."""
    try:
        check_json_value(payload, "the payload")
        return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidEvent(f"the payload is not JSON: {exc}") from None


def body_sha256(body: bytes) -> str:
    """The digest that tells a duplicate (same body) from a reused id (another body)."""
    return hashlib.sha256(body).hexdigest()

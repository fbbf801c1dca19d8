"""Events from Python: the producer behind ``task.send(...)``.

An event sent from Python goes through the receiver's own accept script
(:mod:`keylane.producers.gateway`): the same dedupe on the event id (a second send of one
id is a duplicate and changes nothing; the same id with another payload is refused), the
same high-water mark, the same shard queue. The core is async; :meth:`Sender.send` runs it
on the sender's own event-loop thread, so it can be called from any thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from ..routing.contract.errors import BrokerUnavailable, InvalidEvent, LeaseLost
from ..routing.contract.events import (
    MAX_ID_CHARS,
    MAX_KEY_CHARS,
    Change,
    Event,
    check_json_value,
)
from ..routing.contract.schedules import RunLease
from ..routing.contract.settings import Settings
from .gateway import ReceiverGateway, accepted_answer
from .intake import KEYLESS_PREFIX

SEND_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Sent:
    """What became of a send: ``accepted`` (queued) or ``duplicate`` (this event id was
    sent before with the same payload; nothing was queued)."""

    status: Literal["accepted", "duplicate"]
    event_id: str
    record_key: str
    shard: int
    key_missing: bool = False


class Sender:
    """Sends events into a deployment's shard queues (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="keylane-sender", daemon=True
        )
        self._thread.start()
        self._gateway: ReceiverGateway | None = None

    def send(self, batch: int = 1, lease: RunLease | None = None, **fields: Any) -> Sent:
        """Queue an event built from ``fields`` (the keyword arguments of
        :func:`new_event`: source, destination, payload, record_key, event_id,
        event_type, changes), deduplicated on ``(source, event_id)`` (no id: a unique
        one, never a duplicate); ``batch``: how many of its record's waiting events a lane
        may take with it (a batch task's limit); ``lease``: a scheduled run's, without
        which nothing is accepted (:class:`LeaseLost`). Raises :class:`InvalidEvent` for
        an id reused with another payload, :class:`BrokerUnavailable` when Redis or the
        shard cannot take it now."""
        event = new_event(self.settings, **fields)
        future = asyncio.run_coroutine_threadsafe(self._accept(event, batch, lease), self._loop)
        return future.result(SEND_TIMEOUT_S)

    async def send_async(
        self, batch: int = 1, lease: RunLease | None = None, **fields: Any
    ) -> Sent:
        """:meth:`send` for async code (the same keyword arguments)."""
        event = new_event(self.settings, **fields)
        future = asyncio.run_coroutine_threadsafe(self._accept(event, batch, lease), self._loop)
        return await asyncio.wrap_future(future)

    async def _accept(self, event: Event, batch: int, lease: RunLease | None) -> Sent:
        s = self.settings
        if self._gateway is None:
            self._gateway = ReceiverGateway.from_url(s.redis_dsn(), s.keys, s.shards)
        queue = s.shards.queue_name(event.shard)
        answer = json.dumps(accepted_answer(event, queue))
        result = await self._gateway.accept_event(
            event, queue, answer, s.dedupe_retention_s * 1000, s.shard_high_water, batch, lease
        )
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
        status: Literal["accepted", "duplicate"] = result.verdict
        return Sent(status, event.event_id, event.record_key, event.shard, event.key_missing)

    def close(self) -> None:
        """Close the connection and stop the loop thread."""
        if self._gateway is not None:
            asyncio.run_coroutine_threadsafe(self._gateway.close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


def new_event(
    settings: Settings,
    source: str,
    destination: str | None,
    payload: Any,
    record_key: str,
    event_id: str | None = None,
    event_type: str = "event",
    changes: dict[str, Change] | None = None,
) -> Event:
    """An event for ``destination`` carrying ``payload``, or (``destination`` None) a
    change to one of keylane's records (``InvalidEvent`` if it cannot be)."""
    try:
        check_json_value(payload, "the payload")
        body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidEvent(f"the payload is not JSON: {exc}") from None
    if event_id is not None and not 0 < len(event_id) <= MAX_ID_CHARS:
        raise InvalidEvent(f"event ids are 1..{MAX_ID_CHARS} characters")
    if not 0 < len(record_key) <= MAX_KEY_CHARS:
        raise InvalidEvent(f"record keys are 1..{MAX_KEY_CHARS} characters")
    try:
        return Event(
            source=source,
            event_id=event_id or f"{KEYLESS_PREFIX}{uuid.uuid4()}",
            event_type=event_type,
            record_key=record_key,
            changes=changes or {},
            body_sha256=hashlib.sha256(body).hexdigest(),
            accepted_at=time.time(),
            shard=settings.shards.shard_for_key(record_key),
            key_missing=event_id is None,
            destination=destination,
            payload=payload,
        )
    except ValueError as exc:
        raise InvalidEvent(str(exc)) from None

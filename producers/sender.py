"""Events from Python: the producer behind ``task.send(...)``.

An event sent from Python goes through the receiver's own accept script
(:mod:`keylane.producers.gateway`): the same dedupe on the event id (a second send of one
id is a duplicate and changes nothing; the same id with another payload is refused), the
same high-water mark, the same shard queue. The core is async; :meth:`Sender.send` runs it
on the sender's own event-loop thread, so it can be called from any thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..routing.contract.errors import BrokerUnavailable, InvalidEvent, LeaseLost
from ..routing.contract.events import wire_changes
from ..routing.contract.schedules import RunLease
from ..routing.contract.settings import Settings
from .accept import Acceptor, NewEvent, body_sha256, new_event, payload_body
from .broker import open_event_queue
from .intake import keyless_id

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
        self._acceptor: Acceptor | None = None

    def send(self, batch: int = 1, lease: RunLease | None = None, **fields: Any) -> Sent:
        """Queue an event built from ``fields`` (the keyword arguments of
        :meth:`new_event`: source, destination, payload, record_key, event_id,
        event_type, changes), deduplicated on ``(source, event_id)`` (no id: a unique
        one, never a duplicate); ``batch``: how many of its record's waiting events a lane
        may take with it (a batch task's limit); ``lease``: a scheduled run's, without
        which nothing is accepted (:class:`LeaseLost`). Raises :class:`InvalidEvent` for
        an id reused with another payload, :class:`BrokerUnavailable` when Redis or the
        shard cannot take it now."""
        event = self.new_event(**fields)
        future = asyncio.run_coroutine_threadsafe(self._accept(event, batch, lease), self._loop)
        return future.result(SEND_TIMEOUT_S)

    async def send_async(
        self, batch: int = 1, lease: RunLease | None = None, **fields: Any
    ) -> Sent:
        """:meth:`send` for async code (the same keyword arguments)."""
        event = self.new_event(**fields)
        future = asyncio.run_coroutine_threadsafe(self._accept(event, batch, lease), self._loop)
        return await asyncio.wrap_future(future)

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
    ) -> NewEvent:
        """An event for ``destination`` carrying ``payload``, or (``destination`` None) a
        change to one of keylane's records (``InvalidEvent`` if it cannot be)."""
        wire = None
        if changes is not None:
            try:
                wire = wire_changes(dict(changes))
            except ValueError as exc:
                raise InvalidEvent(str(exc)) from None
        body = payload_body(payload if wire is None else {"changes": wire, "payload": payload})
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
        )

    async def _accept(self, event: NewEvent, batch: int, lease: RunLease | None) -> Sent:
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
        status: Literal["accepted", "duplicate"] = result.verdict
        return Sent(status, event.event_id, event.record_key, event.shard, event.key_missing)

    def close(self) -> None:
        """Close the connection and stop the loop thread."""
        if self._acceptor is not None:
            close = self._acceptor.queue.close()
            asyncio.run_coroutine_threadsafe(close, self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

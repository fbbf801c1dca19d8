"""Membership and shard spread: the live workers (a fanout exchange of beats, each worker
an exclusive inbox), and the shards this worker consumes — those the rendezvous assignment
over the live members gives it; a consumer of a shard the assignment moved away that never
became a lease is closed (the broker's own pick would give one worker every shard). Each
beat also names the shards its worker consumes (what ``keylane status`` shows as owners)."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ....routing.assignment import assign_shards
from ....routing.contract.amqp_names import members_exchange
from ....routing.contract.errors import BrokerUnavailable
from .link import message_body, publish
from .parking import Parking


@dataclass(frozen=True)
class Beat:
    """One member's beat: ``alive`` (each heartbeat) or ``left``; the shards it consumes,
    each with its fencing token (0 until its first delivery made it the active consumer),
    its deliveries not acknowledged yet (``unacked``) and its records in a lane."""

    worker: str
    what: str
    info: dict[str, Any]
    shards: dict[int, dict[str, int]]


def read_beat(raw: bytes) -> Beat | None:
    """The beat in ``raw`` (None: not one)."""
    try:
        beat = json.loads(raw)
        shards = {int(s): dict(lead) for s, lead in (beat.get("shards") or {}).items()}
        return Beat(str(beat["worker"]), str(beat["what"]), dict(beat.get("info") or {}), shards)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


class Membership(Parking):
    """The members and the spread of :class:`RabbitLaneBroker`."""

    _members: dict[str, float]
    _member_ttl_s: float
    _info: dict[str, Any]

    def _join_members(self) -> None:
        channel = self._control
        exchange = members_exchange(self.settings.namespace)
        channel.exchange_declare(exchange, "fanout", durable=False, auto_delete=False)
        inbox = f"{exchange}:{uuid.uuid4().hex[:12]}"
        channel.queue_declare(inbox, exclusive=True, auto_delete=True)
        channel.queue_bind(inbox, exchange, "")
        channel.basic_consume(inbox, no_ack=True, callback=self._on_beat)

    def _beat(self, what: str) -> None:
        with self._lock:
            leading = {
                str(c.shard): {"token": c.epoch, "unacked": len(c.deliveries), "busy": len(c.busy)}
                for c in self._shards.values()
                if c.alive
            }
        body = json.dumps(
            {"worker": self.worker_id, "what": what, "info": self._info, "shards": leading}
        )
        exchange = members_exchange(self.settings.namespace)
        publish(self._control, body, exchange)

    def _on_beat(self, message: Any) -> None:
        beat = read_beat(message_body(message))
        if beat is None:
            return
        with self._lock:
            if beat.what == "left":
                self._members.pop(beat.worker, None)
            else:
                self._members[beat.worker] = time.monotonic()

    def heartbeat(self, worker_id: str, info: dict[str, Any], member_ttl_ms: int) -> list[str]:
        self.worker_id, self._info, self._member_ttl_s = worker_id, info, member_ttl_ms / 1000
        now = time.monotonic()
        with self._lock:
            connected = self._connection is not None
            self._members[worker_id] = now if connected else self._members.get(worker_id, 0.0)
            for member, seen in list(self._members.items()):
                if now - seen > self._member_ttl_s:
                    del self._members[member]
            members = sorted(self._members)
        if not connected:
            raise BrokerUnavailable("RabbitMQ: not connected")
        mine = assign_shards(self.settings.shard_count, members).get(worker_id, [])
        self.release_unleased(set(mine))
        self.park_stale()
        return members

    def leave(self, worker_id: str) -> None:
        with contextlib.suppress(BrokerUnavailable):
            self._submit(lambda: self._beat("left"), wait=True)

    def release_unleased(self, keep: set[int]) -> None:
        """Stop consuming the shards not in ``keep`` that never became a lease (a
        consumer registered for a shard the assignment has since moved away)."""
        with self._lock:
            idle = [c for s, c in self._shards.items() if s not in keep and c.epoch == 0]
        self._let_go(idle, "released")

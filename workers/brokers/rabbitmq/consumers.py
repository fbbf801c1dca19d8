"""What this worker holds of each shard queue it consumes: the consumer registration and
its unacknowledged deliveries, grouped by record in delivery order (in memory only: the
broker gives them back when the channel or connection closes)."""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ....routing.contract.message import (
    BATCH_HEADER,
    RECORD_HEADER,
    RETRY_OF_HEADER,
    UNHOLD_HEADER,
)

#: The due time of a held record's parked messages (:meth:`ShardConsumer.parked_due`):
#: never, until the dead letter that holds it is closed or retried.
HELD = math.inf


#: The Celery headers a delivery is read for (:func:`delivery_headers`), as they appear
#: in a message's JSON envelope.
READ_HEADERS = tuple(
    f'"{name}"'.encode() for name in (BATCH_HEADER, UNHOLD_HEADER, RETRY_OF_HEADER)
)


def delivery_headers(raw: bytes, amqp_headers: dict[str, Any]) -> dict[str, Any]:
    """The Celery headers of a delivery that taking it needs: a message that carries its
    record key in its AMQP headers and names none of :data:`READ_HEADERS` anywhere has
    none of them (its event travels base64-encoded, where no ``"`` occurs), so its JSON
    is not decoded here: the lane decodes it once, when it applies it."""
    if amqp_headers.get(RECORD_HEADER) and not any(name in raw for name in READ_HEADERS):
        return {}
    return message_headers(raw)


def message_headers(raw: bytes) -> dict[str, Any]:
    """The Celery headers in a keylane message (the Redis envelope it travels in)."""
    try:
        headers = json.loads(raw).get("headers") or {}
    except (ValueError, AttributeError):
        return {}
    return headers if isinstance(headers, dict) else {}


def record_key_of(headers: dict[str, Any], embedded: dict[str, Any]) -> str:
    """A message's record key: from its AMQP headers, else from the Celery headers it
    carries (``embedded``, :func:`message_headers`)."""
    return str(headers.get(RECORD_HEADER) or embedded.get(RECORD_HEADER) or "")


@dataclass
class Delivery:
    """A message the shard's channel delivered and this worker has not acknowledged."""

    tag: int
    raw: bytes
    record_key: str
    batch: str
    #: Times it was tried before this delivery: the broker's ``x-delivery-count``, brought
    #: down to the tries the store noted once a lane takes it (:mod:`.tries`).
    returned: int
    #: Times a lane of this worker took it.
    taken: int = 0
    received: float = field(default_factory=time.monotonic)
    notes: dict[str, Any] = field(default_factory=dict)
    #: Whether a try of this delivery is noted in the store (:mod:`.tries`).
    noted: bool = False
    #: A release (``keylane_unhold``): the dead letter it releases the record from.
    unhold: int | None = None
    #: An operator's retry (``keylane_retry_of``): the dead letter it retries.
    retry_of: int | None = None


@dataclass
class Settled:
    """What a channel's acknowledgements settled so far (the AMQP thread's alone: see
    :mod:`.acks`)."""

    #: Every tag below this one is acknowledged.
    below: int = 1
    #: Tags at or past ``below`` acknowledged one by one (a gap before them).
    singly: set[int] = field(default_factory=set)

    def plan(self, tags: Sequence[int]) -> tuple[int, list[int]]:
        """Take ``tags`` (new acknowledgements): the tag to acknowledge with ``multiple``
        (0: none), and the tags to acknowledge one by one."""
        wanted = set(tags)
        start = self.below
        while self.below in wanted or self.below in self.singly:
            self.singly.discard(self.below)
            self.below += 1
        # The run's last *new* tag: RabbitMQ refuses a ``multiple`` ack whose own tag was
        # acknowledged before ("unknown delivery tag"), even with others below it open.
        upto = max((tag for tag in wanted if start <= tag < self.below), default=0)
        single = sorted(tag for tag in wanted if tag >= self.below)
        self.singly.update(single)
        return upto, single


@dataclass
class ShardConsumer:
    """This worker's consumer of one shard queue, and what it holds."""

    shard: int
    channel: Any
    tag: str
    #: The store token claimed for this registration (0: not active yet / not claimed).
    epoch: int = 0
    active: bool = False
    alive: bool = True
    deliveries: dict[int, Delivery] = field(default_factory=dict)
    #: Record key -> its deliveries' tags, in delivery order; records in order of arrival.
    records: OrderedDict[str, list[int]] = field(default_factory=OrderedDict)
    #: Records with a lane: the tags handed out, and since when.
    busy: dict[str, tuple[list[int], float]] = field(default_factory=dict)
    #: Records waiting until a time (monotonic).
    due: dict[str, float] = field(default_factory=dict)
    #: Records with messages parked in the store, and when the store has them due
    #: (epoch seconds): their deliveries here wait behind those (they are parked too,
    #: then acknowledged). Read the due time with :meth:`parked_due` (a hold overrides it).
    parked: dict[str, float] = field(default_factory=dict)
    #: Records held behind a dead letter (policy ``hold``) -> its id, as in the store:
    #: never due until released, parked messages or not; their deliveries here wait
    #: behind the hold as behind parked messages.
    held: dict[str, int] = field(default_factory=dict)
    #: The acknowledgements sent on the channel (:mod:`.acks`).
    settled: Settled = field(default_factory=Settled)

    def lease_value(self, worker_id: str) -> str:
        return f"{worker_id}/{self.tag}"

    def in_store(self) -> list[str]:
        """The records that wait in the store: parked, or held (parked messages or not)."""
        return [*self.parked, *(key for key in self.held if key not in self.parked)]

    def waits_in_store(self, key: str) -> bool:
        """Whether ``key``'s deliveries here must wait behind the store (see
        :meth:`in_store`)."""
        return key in self.parked or key in self.held

    def parked_due(self, key: str, default: float) -> float:
        """When ``key``'s parked messages are due (epoch seconds): :data:`HELD` while it is
        held, else as the store has them (``default`` when nothing is parked)."""
        return HELD if key in self.held else self.parked.get(key, default)

    def due_parked(self) -> list[tuple[str, float]]:
        """The parked records that are not held, each with its due time."""
        return [(key, at) for key, at in self.parked.items() if key not in self.held]


def dead_letter_id(value: Any) -> int | None:
    """A dead letter id from a header (None when absent or not a number)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def batch_limit(tag: str) -> int:
    """How many messages of one record may go together (``<limit>:<digest>``)."""
    if not tag:
        return 1
    try:
        return max(1, int(tag.partition(":")[0]))
    except ValueError:
        return 1

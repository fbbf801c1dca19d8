"""What this worker holds of each shard queue it consumes: the consumer registration and
its unacknowledged deliveries, grouped by record in delivery order (in memory only: the
broker gives them back when the channel or connection closes)."""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ....routing.contract.message import RECORD_HEADER

#: The due time of a held record's parked messages (:meth:`ShardConsumer.parked_due`):
#: never, until the dead letter that holds it is closed or retried.
HELD = math.inf


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

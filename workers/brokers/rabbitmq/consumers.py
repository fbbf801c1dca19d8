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

#: The due time of a held record's parked messages (see :class:`ShardConsumer`): never,
#: until the dead letter that holds it is closed or retried.
HELD = math.inf


def message_headers(raw: bytes) -> dict[str, Any]:
    """The Celery headers in a keylane message (the Redis envelope it travels in)."""
    try:
        headers = json.loads(raw).get("headers") or {}
    except (ValueError, AttributeError):
        return {}
    return headers if isinstance(headers, dict) else {}


@dataclass
class Delivery:
    """A message the shard's channel delivered and this worker has not acknowledged."""

    tag: int
    raw: bytes
    record_key: str
    batch: str
    #: Times the broker handed it out before (``x-delivery-count``).
    returned: int
    #: Times a lane of this worker took it.
    taken: int = 0
    received: float = field(default_factory=time.monotonic)
    notes: dict[str, Any] = field(default_factory=dict)
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
    #: Records with messages parked in the store, and when they are due (epoch seconds):
    #: their deliveries here wait behind those (they are parked too, then acknowledged).
    #: A held record is here too, due :data:`HELD` (never), even with nothing parked.
    parked: dict[str, float] = field(default_factory=dict)
    #: Records held behind a dead letter (policy ``hold``) -> its id, as in the store.
    held: dict[str, int] = field(default_factory=dict)
    #: Releases that met no hold (the record was released already, or never held):
    #: taken out of their records' lists, to be acknowledged.
    strays: list[int] = field(default_factory=list)

    def lease_value(self, worker_id: str) -> str:
        return f"{worker_id}/{self.tag}"


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

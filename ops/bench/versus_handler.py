"""The versus benchmark's source handler, run by keylane's lanes on every attempt.

The event carries its amount and sequence number as ``total: increment`` and ``seqs:
append``, and its destination latency in its type (``versus.rmw.<ms>``). The handler is
given the record as the lane just read it, awaits the latency (as an ``async def`` handler
calling an API does: the lane holds no thread meanwhile), and returns the record's
new fields computed from that read, as ``set`` operations: the same read-modify-write
the Celery baselines run (:func:`keylane.ops.bench.versus_dest.read_sleep_write`). The
lane then writes it only if the record is still at the revision it read.

:func:`read_sleep_write_batch` is the same as a batch handler: a lane that finds several
events of a record waiting hands them over together, and one wait (one destination call)
covers them all, as a user's batch handler writing to an API once per batch does.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ...routing.contract.events import Event
from ...workers.store_rows import Record

TYPE_PREFIX = "versus.rmw."


def event_type(latency_ms: int) -> str:
    """The event type that tells the handler its latency."""
    return f"{TYPE_PREFIX}{latency_ms}"


async def read_sleep_write(event: Event, record: Record) -> dict[str, Any]:
    """The record's new ``total`` and ``seqs``, computed from ``record`` after the wait."""
    latency_ms = int(event.event_type.removeprefix(TYPE_PREFIX))
    amount = int(event.changes["total"].value)
    seq = int(event.changes["seqs"].value)
    total = int(record.fields.get("total", 0))
    seqs = list(record.fields.get("seqs", []))
    await asyncio.sleep(latency_ms / 1000)
    return {"total": {"set": total + amount}, "seqs": {"set": [*seqs, seq]}}


async def read_sleep_write_batch(events: list[Event], record: Record) -> list[dict[str, Any]]:
    """The batch form: the record's waiting events at once, one wait for all of them (one
    destination call), and each event's ``total`` and ``seqs`` as they stand after it."""
    latency_ms = int(events[0].event_type.removeprefix(TYPE_PREFIX))
    total = int(record.fields.get("total", 0))
    seqs = list(record.fields.get("seqs", []))
    await asyncio.sleep(latency_ms / 1000)
    changes: list[dict[str, Any]] = []
    for event in events:
        total += int(event.changes["total"].value)
        seqs = [*seqs, int(event.changes["seqs"].value)]
        changes.append({"total": {"set": total}, "seqs": {"set": seqs}})
    return changes

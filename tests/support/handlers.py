"""Lane handlers (``handler = "tests.support.handlers:..."`` in a sources file)."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from keylane.routing.contract.events import Event
from keylane.workers.store_rows import Record


def fail_on_bad(event: Event, record: Record) -> dict[str, Any]:
    """Apply the event's own change, except on ``bad:*`` records, where it always raises."""
    if event.record_key.startswith("bad:"):
        raise RuntimeError(f"this handler cannot deal with {event.record_key}")
    return event.changes_wire()


def tier_from_total(event: Event, record: Record) -> dict[str, Any] | None:
    """Computed from the record as freshly read: add the amount, and set ``tier`` from the
    new total (so a retry after a conflict computes it again from the newer total)."""
    amount = event.changes["amount"].value
    total = record.fields.get("total", 0) + amount
    return {"total": {"set": total}, "tier": {"set": "gold" if total >= 1000 else "basic"}}


def fail_with_secrets(event: Event, record: Record) -> dict[str, Any]:
    """Always raises, quoting the Redis password and the ``TEST_GH_SECRET`` signing secret
    of this process, the way a careless driver's error message might."""
    password = urlsplit(os.environ["KEYLANE_REDIS_URL"]).password
    secret = os.environ["TEST_GH_SECRET"]
    raise ConnectionError(f"login failed with password {password}; webhook secret {secret}")


def running_totals(events: list[Event], record: Record) -> list[dict[str, Any]]:
    """A batch handler: one call per batch. Each event sets ``total`` to the running total
    of ``amount`` from the record as read; the first also counts the call in ``calls``."""
    total = record.fields.get("total", 0)
    changes: list[dict[str, Any]] = []
    for event in events:
        total += event.changes["amount"].value
        changes.append({"total": {"set": total}})
    changes[0]["calls"] = {"increment": 1}
    return changes

"""A task whose callers wait to be told what it did (``tests/test_sender_outcomes.py``):
it returns the table it reserved, or refuses a party too large."""

from __future__ import annotations

from typing import Any

import keylane


@keylane.task(key="table:{table}")
def reserve_table(event: keylane.Event, ctx: keylane.Context) -> dict[str, Any]:
    """Reserve a table: what it returns is the caller's result; more than 8 guests is a
    refusal (a business answer, told with its reason)."""
    guests = int(event.payload["guests"])
    if guests > 8:
        raise keylane.Refuse("too many guests", guests=guests)
    return {"table": event.payload["table"], "guests": guests}

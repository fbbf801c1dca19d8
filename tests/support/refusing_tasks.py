"""User tasks that answer as a business does (``keylane worker -A tests.support.refusing_tasks``):
a booking that refuses a taken slot with ``keylane.Refuse`` (raised or returned), and a task
whose return value is JSON, too large, or not JSON. Each run is written down in
``TEST_RUNS_FILE`` (one event id a line), so a test can count how often a task ran."""

from __future__ import annotations

import os
from typing import Any

import keylane


def _ran(event: keylane.Event) -> None:
    with open(os.environ["TEST_RUNS_FILE"], "a", encoding="utf-8") as runs:
        runs.write(event.event_id + "\n")


@keylane.task(key="slot:{slot}")
def book_slot(event: keylane.Event, ctx: keylane.Context) -> Any:
    """Book a slot: refuse it when the payload says it is taken (raised, or returned with
    ``politely``), else return the booking as JSON."""
    _ran(event)
    slot = event.payload["slot"]
    if event.payload.get("politely"):
        return keylane.Refuse("slot taken", slot=slot, by="someone else")
    if event.payload.get("taken"):
        raise keylane.Refuse("slot taken", slot=slot, by="someone else")
    return {"booked": slot, "who": event.payload.get("who")}


@keylane.task(key="doc:{doc}")
def render_doc(event: keylane.Event, ctx: keylane.Context) -> Any:
    """Return a large document (``big``) or a value that is not JSON (``set``)."""
    _ran(event)
    if event.payload["kind"] == "big":
        return {"text": "x" * 2000}
    return {1, 2, 3}

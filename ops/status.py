"""``keylane status``: who owns which shard, how deep each queue is, which workers live.

:func:`collect_status` builds one JSON-ready report (``--json`` prints it as it is; the
text view is :mod:`keylane.ops.status_text`). Each shard gets a ``state``: ``stuck`` (it
has events and no owner, or its oldest event waits longer than ``stuck_after_s``),
``busy`` (it has events) or ``idle``.
"""

from __future__ import annotations

import time
from typing import Any

from ..routing.contract.message import MalformedMessage, parse_message
from ..routing.contract.settings import Settings
from .telemetry import DeploymentView

#: A shard whose oldest event (queued or in flight) is older than this is ``stuck``.
STUCK_AFTER_S = 60.0


def collect_status(
    settings: Settings, view: DeploymentView, stuck_after_s: float = STUCK_AFTER_S
) -> dict[str, Any]:
    """A JSON-ready picture of the deployment."""
    now = time.time()
    shards = [_shard(state, now, stuck_after_s) for state in view.shard_states()]
    members = view.members()
    for member in members:
        member["heartbeat_age_s"] = round(now - member.pop("heartbeat_ms") / 1000, 3)
        member["shards"] = sum(1 for s in shards if s["owner"] == member["worker"])
    return {
        "namespace": settings.namespace,
        "shard_count": settings.shard_count,
        "stuck_after_s": stuck_after_s,
        "shards": shards,
        "workers": members,
        "counters": view.counters(),
        "unowned": [s["shard"] for s in shards if s["owner"] is None],
        "destinations": [
            {
                "destination": d.name,
                "in_flight": d.in_flight,
                "max_in_flight": d.max_in_flight,
                "rate_per_s": d.rate_per_s,
                "adapted_rate_per_s": d.adapted_rate_per_s,
                "rate_now_per_s": d.rate_now,
                "next_token_s": d.next_token_s,
                "paused_s": d.paused_for_s,
                **d.counters,
            }
            for d in view.destinations()
        ],
    }


def _shard(state: dict[str, Any], now: float, stuck_after_s: float) -> dict[str, Any]:
    """One shard's row: owner and token from its lease, the event in flight and how long
    it has waited since it was accepted, the age of its oldest event, its state."""
    holder = state.pop("holder")
    inflight = state.pop("inflight")
    head = state.pop("head")
    state["owner"] = holder.rsplit("/", 1)[0] if holder else None
    state["token"] = int(holder.rsplit("/", 1)[1]) if holder else None
    state["in_flight"] = _describe(inflight)
    ages = {name: _age(raw, now) for name, raw in (("in_flight", inflight), ("head", head))}
    state["in_flight_age_s"] = ages["in_flight"]
    # The oldest event of the shard: the one in flight (retrying, waiting for its
    # destination) when there is one, else the head of the queue.
    known = [a for a in ages.values() if a is not None]
    state["oldest_age_s"] = max(known) if known else None
    state["state"] = _state_of(state, stuck_after_s)
    return state


def _state_of(shard: dict[str, Any], stuck_after_s: float) -> str:
    has_work = shard["depth"] > 0 or shard["in_flight"] is not None
    if not has_work:
        return "idle"
    too_old = (shard["oldest_age_s"] or 0) > stuck_after_s
    return "stuck" if shard["owner"] is None or too_old else "busy"


def _age(raw: bytes | None, now: float) -> float | None:
    event = _event_of(raw)
    accepted_at = None if event is None else event.get("accepted_at")
    if not isinstance(accepted_at, int | float):
        return None
    return round(max(0.0, now - accepted_at), 3)


def _event_of(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        event = parse_message(raw).kwargs.get("event")
    except MalformedMessage:
        return None
    return event if isinstance(event, dict) else None


def _describe(raw: bytes | None) -> str | None:
    event = _event_of(raw)
    if raw is None:
        return None
    if event is None:
        return "(malformed)"
    return f"{event.get('source')}/{event.get('event_id')} -> {event.get('record_key')}"

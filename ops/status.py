"""``keylane status``: who owns which shard, how deep each queue is, which workers live."""

from __future__ import annotations

import time
from typing import Any

from ..routing.contract.errors import MalformedMessage
from ..routing.contract.message import parse_message
from ..routing.contract.settings import Settings
from .deployment_view import DeploymentView


def collect_status(settings: Settings, view: DeploymentView) -> dict[str, Any]:
    """A JSON-ready picture of the deployment."""
    now = time.time()
    shards = []
    for state in view.shard_states():
        holder = state.pop("holder")
        head = state.pop("head")
        state["owner"] = holder.rsplit("/", 1)[0] if holder else None
        state["token"] = int(holder.rsplit("/", 1)[1]) if holder else None
        head_event = _event_of(head)
        state["oldest_age_s"] = round(now - head_event["accepted_at"], 3) if head_event else None
        shards.append(state)
    busy = [s["shard"] for s in shards if s["in_flight"] or s["waiting"]]
    records = view.records(busy)
    for record in records:
        shard = shards[record["shard"]]
        shard.setdefault("records", []).append(record)
        since = record.get("since")
        if since is not None:
            age = round(now - since, 3)
            shard["oldest_age_s"] = max(age, shard["oldest_age_s"] or 0.0)
    members = view.members()
    for member in members:
        member["heartbeat_age_s"] = round(now - member.pop("heartbeat_ms") / 1000, 3)
        member["shards"] = sum(1 for s in shards if s["owner"] == member["worker"])
    return {
        "namespace": settings.namespace,
        "shard_count": settings.shard_count,
        "shards": shards,
        "workers": members,
        "counters": view.counters(),
        "unowned": [s["shard"] for s in shards if s["owner"] is None],
        "waiting_records": [r for r in records if r["state"] != "in_flight"],
        "destinations": [
            {
                "destination": d.name,
                "in_flight": d.in_flight,
                "max_in_flight": d.max_in_flight,
                "rate_per_s": d.rate_per_s,
                "next_token_s": d.next_token_s,
                "paused_s": d.paused_for_s,
                **d.counters,
            }
            for d in view.destinations()
        ],
        "schedules": [state.as_dict() for state in view.schedules()],
    }


def _event_of(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        event = parse_message(raw).kwargs.get("event")
    except MalformedMessage:
        return None
    return event if isinstance(event, dict) else None

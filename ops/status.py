"""``keylane status``: who owns which shard, how deep each queue is, which workers live."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from ..routing.contract.errors import BrokerUnavailable, StoreUnavailable
from ..routing.contract.message import MalformedMessage, parse_message
from ..routing.contract.settings import Settings
from ..workers.stores.base import TableAge
from .telemetry import DeploymentView

#: The tables ``keylane status`` shows the size of: the journal, closed review rows, the
#: archived ids still recognised, and the lease log (in Redis).
RETAINED = ("journal", "dead_letters", "archived_ids", "lease_log")


def collect_status(settings: Settings, view: DeploymentView) -> dict[str, Any]:
    """A JSON-ready picture of the deployment."""
    now = time.time()
    shards = []
    for state in view.shard_states():
        holder = state.pop("holder")
        inflight = state.pop("inflight")
        head = state.pop("head")
        state["owner"] = holder.rsplit("/", 1)[0] if holder else None
        state["token"] = int(holder.rsplit("/", 1)[1]) if holder else None
        state["in_flight"] = _describe(inflight)
        head_event = _event_of(head)
        state["oldest_age_s"] = round(now - head_event["accepted_at"], 3) if head_event else None
        shards.append(state)
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
    }


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


def collect_retention(settings: Settings) -> dict[str, Any]:
    """The store's tables as they are now (as the last prune saw them when the store
    does not answer; the lease log always so), and the last prune."""
    from ..workers.stores import open_store
    from .retention import retention_records

    records = retention_records(settings)
    figures: dict[str, float] = {}
    if records is not None:
        with contextlib.suppress(BrokerUnavailable):
            figures = records.figures()
        records.close()
    try:
        store = open_store(settings.store_dsn(), settings.store_timeout_ms)
    except StoreUnavailable:
        return retention_status({}, figures)
    try:
        store.migrate()  # a store no worker has written to yet reads as empty
        return retention_status(store.table_ages(), figures)
    except StoreUnavailable:
        return retention_status({}, figures)
    finally:
        store.close()


def retention_status(
    ages: dict[str, TableAge], figures: dict[str, float], now: float | None = None
) -> dict[str, Any]:
    """The store's tables (rows, age of the oldest) and the last prune, for ``keylane
    status``: ``ages`` as read now, else as the last prune recorded them (``figures``)."""
    now = time.time() if now is None else now
    tables: dict[str, Any] = {}
    for table in RETAINED:
        age = ages.get(table)
        if age is None and f"{table}_rows" in figures:
            age = TableAge(int(figures[f"{table}_rows"]), figures.get(f"{table}_oldest"))
        if age is not None:
            oldest = None if age.oldest is None else round(now - age.oldest, 1)
            tables[table] = {"rows": age.rows, "oldest_age_s": oldest}
    last = figures.get("last_prune_at")
    return {
        "tables": tables,
        "last_prune_age_s": None if last is None else round(now - last, 1),
        "last_prune_seconds": figures.get("last_prune_seconds"),
        "last_prune_longest_batch_s": figures.get("last_prune_longest_batch_seconds"),
        "archived_total": {
            t: int(figures.get(f"archived_{t}", 0)) for t in RETAINED if t != "archived_ids"
        },
    }

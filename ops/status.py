"""``keylane status``: who owns which shard, how deep each queue is, which records are in
flight or wait and why, which workers live.

:func:`collect_status` builds one JSON-ready report (``--json`` prints it as it is; the
text view is :mod:`keylane.ops.status_text`). Each shard gets a ``state``: ``stuck`` (it
has events and no owner, or its oldest event waits longer than ``stuck_after_s``),
``busy`` (it has events) or ``idle``.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from ..routing.contract.errors import BrokerUnavailable, StoreMissing, StoreUnavailable
from ..routing.contract.message import event_of
from ..routing.contract.settings import Settings
from ..workers.store_rows import TableAge
from .deployment_view import DeploymentView

#: A shard whose oldest event (queued, in flight or waiting) is older than this is ``stuck``.
STUCK_AFTER_S = 60.0
#: The tables ``keylane status`` shows the size of: the journal, closed review rows, the
#: archived ids still recognised, and the lease log (in Redis).
RETAINED = ("journal", "dead_letters", "archived_ids", "lease_log")


def collect_status(
    settings: Settings, view: DeploymentView, stuck_after_s: float = STUCK_AFTER_S
) -> dict[str, Any]:
    """A JSON-ready picture of the deployment."""
    now = time.time()
    shards = [_shard(state, now) for state in view.shard_states()]
    records = view.records([s["shard"] for s in shards if s["in_flight"] or s["waiting"]])
    for record in records:
        shard = shards[record["shard"]]
        shard.setdefault("records", []).append(record)
        if record["accepted_at"] is not None:  # its head event: in flight, waiting or held
            record["age_s"] = round(max(0.0, now - record["accepted_at"]), 3)
            shard["oldest_age_s"] = max(record["age_s"], shard["oldest_age_s"] or 0.0)
    for shard in shards:
        shard["state"] = _state_of(shard, stuck_after_s)
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
        "backlog": view.backlog(),
        "unowned": [s["shard"] for s in shards if s["owner"] is None],
        "waiting_records": [r for r in records if r["state"] != "in_flight"],
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
        "schedules": [state.as_dict() for state in view.schedules()],
    }


def _shard(state: dict[str, Any], now: float) -> dict[str, Any]:
    """One shard's row: owner and token from its lease, and the age of the event at the
    head of its queue (records in flight and waiting are added by the caller)."""
    holder = state.pop("holder")
    head = event_of(state.pop("head"))
    state["owner"] = holder.rsplit("/", 1)[0] if holder else None
    state["token"] = int(holder.rsplit("/", 1)[1]) if holder else None
    accepted_at = None if head is None else head.get("accepted_at")
    state["oldest_age_s"] = (
        round(max(0.0, now - accepted_at), 3) if isinstance(accepted_at, int | float) else None
    )
    return state


def _state_of(shard: dict[str, Any], stuck_after_s: float) -> str:
    has_work = shard["depth"] > 0 or shard["in_flight"] or shard["waiting"]
    if not has_work:
        return "idle"
    too_old = (shard["oldest_age_s"] or 0) > stuck_after_s
    return "stuck" if shard["owner"] is None or too_old else "busy"


def collect_retention(settings: Settings) -> dict[str, Any]:
    """The store's tables as they are now (as the last prune saw them when the store
    does not answer; the lease log always so), and the last prune."""
    from ..workers.stores import open_existing_store
    from .retention import retention_records

    records = retention_records(settings)
    figures: dict[str, float] = {}
    if records is not None:
        with contextlib.suppress(BrokerUnavailable):
            figures = records.figures()
        records.close()
    try:  # never one a command creates: no store yet reads as the last prune saw it
        store = open_existing_store(settings.store_dsn(), settings.store_timeout_ms)
    except (StoreUnavailable, StoreMissing):
        return retention_status({}, figures)
    try:
        return retention_status(store.table_ages(), figures)
    except StoreUnavailable:
        return retention_status({}, figures)
    finally:
        store.close()


def collect_merges(settings: Settings, counters: dict[str, int]) -> dict[str, Any]:
    """Merges applied, waiting for a person (open ``merge_review`` rows: None when the
    store does not answer), proposed for a pair kept apart, and events forwarded."""
    from ..workers.store_rows import MERGE_REVIEW
    from ..workers.stores import open_existing_store

    pending: int | None = None
    with contextlib.suppress(StoreUnavailable, StoreMissing):
        store = open_existing_store(settings.store_dsn(), settings.store_timeout_ms)
        try:
            pending = sum(
                row["count"]
                for row in store.dead_letter_stats()
                if row["reason"] == MERGE_REVIEW and row["status"] == "open"
            )
        except StoreUnavailable:
            pass
        finally:
            store.close()
    return {
        "applied": counters.get("merged", 0),
        "pending_review": pending,
        "reviewed": counters.get("merge_reviews", 0),
        "kept_apart": counters.get("merges_kept_apart", 0),
        "undone": counters.get("merges_undone", 0),
        "forwarded": counters.get("forwarded", 0),
    }


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

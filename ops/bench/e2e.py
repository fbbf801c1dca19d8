"""The benchmark's end-to-end workload: increment events over a number of record keys,
the exact check of the invariants afterwards, and the direct-apply baseline.

Each event adds a small number to field ``n`` of its record, so a record's final value
and revision say whether every event had exactly one effect. Per-record order is checked
against what the load generator saw: if one delivery's 202 came back before another
delivery of the same record was sent, the first must have the lower revision. For queues
filled directly, in order (part (c)), :func:`push_order` gives each event the span
``(i, i)``: every earlier push of a record must then have a lower revision.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from ...routing import ShardMap
from ...routing.contract.events import Envelope, Event
from ...routing.contract.sources import DEMO
from ...workers.changes import apply_changes
from ...workers.lane_store import event_write
from ...workers.store import JournalStore
from ...workers.store_rows import DeadLetterFilter, Fence
from ...workers.stores import open_store
from ...workers.stores.sql import SqlStore

EVENT_TYPE = "bench.increment"


@dataclass(frozen=True)
class Workload:
    """The bodies of one run and what the store must hold once they are applied."""

    run: str
    keys: int
    bodies: list[bytes]
    event_ids: list[str]
    record_keys: list[str]
    increments: list[int]

    def totals(self) -> dict[str, tuple[int, int]]:
        """Per record key: the sum of its increments and its number of events."""
        out: dict[str, tuple[int, int]] = {}
        for key, by in zip(self.record_keys, self.increments, strict=True):
            total, count = out.get(key, (0, 0))
            out[key] = (total + by, count + 1)
        return out


def workload(run: str, events: int, keys: int) -> Workload:
    """``events`` increments spread round-robin over ``keys`` records named for ``run``."""
    ids, record_keys, increments, bodies = [], [], [], []
    for i in range(events):
        event_id = f"{run}-{i}"
        key = f"bench:{run}:{i % keys}"
        by = (i * 7919) % 13 + 1
        body = {
            "id": event_id,
            "type": EVENT_TYPE,
            "record_key": key,
            "changes": {"n": {"increment": by}},
        }
        ids.append(event_id)
        record_keys.append(key)
        increments.append(by)
        bodies.append(json.dumps(body).encode())
    return Workload(run, keys, bodies, ids, record_keys, increments)


def check_store(
    store: SqlStore,
    work: Workload,
    journal_expected: int,
    spans: Sequence[tuple[float, float] | None] | None = None,
) -> list[str]:
    """Every way the store differs from ``work`` applied exactly once, in order (empty
    when the invariants hold): its journal, dead letters and records."""
    problems = check_journal(store, journal_expected)
    for key, (total, count) in work.totals().items():
        record = store.read(key)
        if record.fields.get("n") != total or record.revision != count:
            problems.append(
                f"{key}: n={record.fields.get('n')} revision={record.revision}, "
                f"expected n={total} revision={count}"
            )
    if spans is not None:
        problems += _check_order(store, work, spans)
    return problems[:20]


def check_journal(store: SqlStore, journal_expected: int) -> list[str]:
    """How the store's journal size and dead letters differ from ``journal_expected``
    entries and none (empty when they do not)."""
    problems: list[str] = []
    size = store.journal_size()
    if size != journal_expected:
        problems.append(f"journal holds {size} entries, expected {journal_expected}")
    dead = store.dead_letters(DeadLetterFilter(limit=3))
    if dead:
        problems.append(f"dead letters present, e.g. {dead[0].reason}: {dead[0].error}")
    return problems


def _check_order(
    store: JournalStore, work: Workload, spans: Sequence[tuple[float, float] | None]
) -> list[str]:
    applied: dict[str, list[tuple[int, float, float, str]]] = defaultdict(list)
    problems: list[str] = []
    for event_id, key, span in zip(work.event_ids, work.record_keys, spans, strict=True):
        entry = store.journal("demo", event_id)
        if entry is None or entry.outcome != "applied" or entry.revision is None:
            outcome = entry.outcome if entry is not None else "no journal entry"
            problems.append(f"{event_id}: {outcome}, expected applied")
            continue
        if span is not None:
            applied[key].append((entry.revision, span[0], span[1], event_id))
    for key, entries in applied.items():
        entries.sort()
        revisions = [e[0] for e in entries]
        if len(set(revisions)) != len(revisions):
            problems.append(f"{key}: two events share a revision")
        # A later revision must not belong to a delivery answered before an earlier
        # revision's delivery was even sent.
        latest_sent, latest_id = float("-inf"), ""
        for _revision, sent, answered, event_id in entries:
            if answered < latest_sent:
                problems.append(
                    f"{key}: {event_id} was answered (or pushed) before {latest_id} was sent, "
                    "but applied after it"
                )
                break
            if sent > latest_sent:
                latest_sent, latest_id = sent, event_id
    return problems


def push_order(events: int) -> list[tuple[float, float] | None]:
    """Spans for :func:`check_store` when the events were pushed in workload order: push
    ``i`` was "sent and answered" at time ``i``."""
    return [(float(i), float(i)) for i in range(events)]


def direct_events(work: Workload, shards: ShardMap) -> list[Event]:
    """The workload as the events a lane would receive (built before any timing)."""
    now = time.time()
    out = []
    for body in work.bodies:
        envelope = Envelope.read(json.loads(body))
        out.append(
            Event(
                source=DEMO.name,
                event_id=envelope.id,
                event_type=envelope.type,
                record_key=envelope.record_key,
                changes=envelope.changes,
                body_sha256="0" * 64,
                accepted_at=now,
                shard=shards.shard_for_key(envelope.record_key),
            )
        )
    return out


@dataclass(frozen=True)
class DirectRun:
    """The raw store cost: the same events applied in one thread, no Redis, no HTTP."""

    elapsed_s: float
    cpu_s: float
    problems: list[str]


def apply_direct(store_url: str, work: Workload, shards: ShardMap) -> DirectRun:
    """Apply ``work`` into a fresh store at ``store_url`` as a lane's apply does (fresh
    read, change, conditional write with its journal entry, under the shard's fence), in
    one thread with no pool, Redis or HTTP around it, and check the result."""
    events = direct_events(work, shards)
    store = open_store(store_url)
    try:
        store.migrate()
        for shard in range(shards.count):
            store.advance_fence(shard, 1)  # as a lane's acquisition does, before timing
        cpu0, t0 = time.process_time(), time.perf_counter()
        for event in events:
            record = store.read(event.record_key)
            fields = apply_changes(record.fields, dict(event.changes), DEMO.ownership, DEMO.name)
            write = event_write(event, fields, record.revision, 1)
            store.commit_event(write, Fence(event.shard, 1))
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        problems = check_store(store, work, len(events))
    finally:
        store.close()
    return DirectRun(elapsed, cpu, problems)

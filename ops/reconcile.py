"""``keylane merges reconcile``: find the records that are one by a stable key the user
defines, and propose their merges through the lanes.

Identities catch two names of one entity when an event carries both. Records that never
met in one event (two imports, a sender that changed its key) are found by a reconcile:
it reads the store page by page (no long transaction, never a write), groups the live
records by a stable key — a field normalised by an identity rule (``--by email``), or the
user's function (``--key module:function``, called with the record key and fields,
returning the stable key or None) — and for each record that shares its key with an older
one queues that pair's close to the lane of the record it absorbs, exactly as an event's
identity would. The lanes then merge a pair whose fields agree and make a review row of
one whose fields differ; a pair a person kept apart is never proposed. Running it again
proposes nothing new for pairs already merged (their close has an outcome), so it can run
on a schedule.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..routing.contract.errors import KeylaneError
from ..routing.contract.identities import (
    MERGE_SOURCE,
    IdentityRule,
    merge_event_id,
    normal_identity,
    survivor_first,
)
from ..routing.contract.message import build_event_message
from ..workers.jobs import import_function
from ..workers.merges import merge_event
from ..workers.store import IdentityStore, JournalStore, RecordStore
from ..workers.store_rows import Record
from .triage import TriageBroker

#: Records read per page.
PAGE = 500

#: The stable key of a record (None: it has none, it is left alone).
StableKey = Callable[[str, dict[str, Any]], "str | None"]


def by_field(name: str, rule: IdentityRule | None) -> StableKey:
    """The stable key: field ``name``'s value, normalised by ``rule`` (by default the
    rule of an identity kind named like the field: ``email``, ``phone``; else exact)."""
    rules = {name: rule} if rule is not None else None

    def key(_record_key: str, fields: dict[str, Any]) -> str | None:
        value = fields.get(name)
        if not isinstance(value, str | int) or isinstance(value, bool):
            return None
        try:
            return normal_identity(f"{name}:{value}", rules)
        except ValueError:
            return None  # not a value of its kind: no key, never a guess

    return key


def by_function(path: str) -> StableKey:
    """The user's stable key function, ``module:function``."""
    return import_function("the reconcile key", path)


@dataclass
class Reconciled:
    """What a reconcile found and proposed."""

    scanned: int = 0
    keyed: int = 0
    groups: int = 0  # stable keys held by more than one live record
    proposed: list[str] = field(default_factory=list)  # close event ids queued
    kept_apart: int = 0
    decided_before: int = 0  # pairs whose merge a lane decided on an earlier run
    seconds: float = 0.0

    @property
    def records_per_s(self) -> float:
        """Records read per second."""
        return self.scanned / self.seconds if self.seconds > 0 else 0.0


def live_records(store: RecordStore, prefix: str) -> Iterator[Record]:
    """The live records whose keys start with ``prefix``, in key order, page by page."""
    after = ""
    while True:
        page = store.scan_records(prefix, after, PAGE)
        if not page:
            return
        yield from (record for record in page if record.merged_into is None)
        after = page[-1].key


def reconcile(
    broker: TriageBroker | None,
    stable_key: StableKey,
    prefix: str = "",
    progress: Callable[[Reconciled], None] | None = None,
    *,
    records: RecordStore,
    identities: IdentityStore,
    journal: JournalStore,
) -> Reconciled:
    """Propose the merge of each live record (read page by page from ``records``) with the
    oldest record sharing its stable key, unless the pair is kept apart (``identities``)
    or its close was decided before (``journal``); ``broker`` None: a dry run, nothing
    queued. ``progress`` is called every page."""
    found = Reconciled()
    started = time.monotonic()
    oldest: dict[str, tuple[str, float | None]] = {}  # stable key -> its oldest record
    grouped: set[str] = set()
    for record in live_records(records, prefix):
        found.scanned += 1
        key = _key_of(stable_key, record)
        if key is not None:
            found.keyed += 1
            other = oldest.get(key)
            mine = (record.key, record.created_at)
            if other is None:
                oldest[key] = mine
            else:
                survivor, absorbed = survivor_first(other, mine)
                oldest[key] = other if survivor == other[0] else mine
                grouped.add(key)
                _propose(identities, journal, broker, found, absorbed, survivor)
        if progress is not None and found.scanned % PAGE == 0:
            found.groups = len(grouped)
            progress(found)
    found.groups = len(grouped)
    found.seconds = time.monotonic() - started
    return found


def _key_of(stable_key: StableKey, record: Record) -> str | None:
    try:
        key = stable_key(record.key, record.fields)
    except Exception as exc:
        raise KeylaneError(f"the reconcile key failed on {record.key!r}: {exc}") from exc
    if key is not None and not isinstance(key, str):
        raise KeylaneError(f"the reconcile key returned {type(key).__name__} for {record.key!r}")
    return key or None


def _propose(
    identities: IdentityStore,
    journal: JournalStore,
    broker: TriageBroker | None,
    found: Reconciled,
    absorbed: str,
    survivor: str,
) -> None:
    if identities.kept_apart(absorbed, survivor):
        found.kept_apart += 1
        return
    event_id = merge_event_id(absorbed, survivor, "close", None)
    if journal.journal(MERGE_SOURCE, event_id) is not None:
        found.decided_before += 1  # reviewed (or under review) already: not again
        return
    if broker is None:
        found.proposed.append(f"{absorbed} -> {survivor}")
        return
    event = merge_event(broker.shards, "close", absorbed, survivor)
    message = build_event_message(event, broker.shards.queue_name(event.shard))
    broker.push_once(f"reconcile:{event.event_id}", event.shard, message)
    found.proposed.append(event.event_id)


def outcomes(store: JournalStore, event_ids: list[str]) -> dict[str, int]:
    """How the proposed closes ended so far: merged, reviewed, not merged (kept apart or
    already one), and pending."""
    counts = {"merged": 0, "reviewed": 0, "not_merged": 0, "pending": 0}
    for event_id in event_ids:
        entry = store.journal(MERGE_SOURCE, event_id)
        if entry is None:
            counts["pending"] += 1
        elif entry.outcome == "dead_lettered":
            counts["reviewed"] += 1
        elif entry.result is not None and "merged_into" in entry.result:
            counts["merged"] += 1
        else:
            counts["not_merged"] += 1
    return counts

"""Merges in the lanes: what a lane does with identities, tombstones and merge steps
(what a merge is, and why it goes this way: :mod:`keylane.routing.contract.identities`).

* After an event with identities is applied (or found applied), the lane proposes a merge
  for each live record another of its identities names: a **close** event, queued to the
  lane of the record that is absorbed (:func:`proposals`).
* A **close** runs in the absorbed record's lane, after the events it accepted before:
  when the two records' fields agree (or a person chose for each field that differs), the
  record becomes a tombstone naming its survivor, and the **absorb** goes to the
  survivor's lane; when they differ, a review row shows both sides and both records go on
  (:func:`close`).
* An **absorb** runs in the survivor's lane: it takes the absorbed record's fields it
  lacks (or a person chose), and the identities that named the absorbed record now name
  it, in one transaction; its journal result keeps what it took and what that replaced,
  what an undo gives back (:func:`absorb`).
* An event whose record is a tombstone goes on to the survivor's lane, one step at a time
  (:func:`forward`).
* A task's records are elsewhere (a task registered with ``on_merge``): its keys have rows
  of no fields, so a close always agrees, and the absorb goes to the task
  (:class:`keylane.workers.dispatch.Dispatcher`), whose ``on_merge`` merges the two
  records where they are; its journal entry moves the identities.

Which fields differ, what field ownership decides and what the survivor takes:
:mod:`keylane.workers.merge_fields`. A person may undo a merge applied:
:mod:`keylane.workers.merge_undo`.

Every step is written with its journal entry in one transaction and is deterministic from
what the store holds, so a redelivery (a crash between the commit and the acknowledgement)
sends again what the step sends, and the next lane's journal keeps it to one effect.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..routing import ShardMap
from ..routing.contract.errors import AlreadyApplied, VersionConflict
from ..routing.contract.events import Event
from ..routing.contract.identities import (
    MERGE_SOURCE,
    GiveBack,
    Merge,
    MergeStep,
    Side,
    merge_event_id,
    survivor_first,
)
from .apply_rules import ApplyRules
from .faults import before_write
from .lane_store import LaneStore, event_write
from .merge_fields import differing, owner_sides, taken_fields
from .results import ApplyResult
from .store import DeadLetterStore, IdentityStore, JournalStore, RecordStore
from .store_rows import MERGE_REVIEW, DeadLetterDraft, EventWrite, Fence, Record

#: The longest chain of tombstones followed to a live record (a chain is as long as the
#: merges that happened one after another before its events were forwarded).
MAX_HOPS = 64


def merge_event(
    shards: ShardMap,
    step: MergeStep,
    absorbed: str,
    survivor: str,
    take: dict[str, Side] | None = None,
    review_of: int | None = None,
    destination: str | None = None,
    gives_back: GiveBack | None = None,
) -> Event:
    """The event of one merge step, for the lane of the record it changes (the absorb of
    a task's keys goes to the task: its ``on_merge``; an undo's steps carry what the
    survivor gives back)."""
    record_key = absorbed if step in ("close", "reopen") else survivor
    merge = Merge(
        step=step,
        absorbed=absorbed,
        survivor=survivor,
        take=take,
        review_of=review_of,
        destination=destination,
        gives_back=gives_back,
    )
    return Event(
        source=MERGE_SOURCE,
        event_id=merge_event_id(absorbed, survivor, step, review_of),
        event_type=f"keylane.merge.{step}",
        record_key=record_key,
        changes={},
        body_sha256="",
        accepted_at=time.time(),
        shard=shards.shard_for_key(record_key),
        destination=destination if step == "absorb" else None,
        merge=merge,
    )


def live_end(store: RecordStore, record_key: str) -> Record:
    """(In a pool thread.) The record ``record_key`` is now: itself, or the live record at
    the end of its chain of tombstones."""
    record = store.read(record_key)
    for _ in range(MAX_HOPS):
        if record.merged_into is None:
            return record
        record = store.read(record.merged_into)
    raise VersionConflict(record_key, 0, record.revision)  # a chain no merge makes


async def with_proposals(
    store: LaneStore, events: Sequence[Event], results: list[ApplyResult], shards: ShardMap
) -> list[ApplyResult]:
    """``results`` with the merges that the identities of the events they settled
    propose (applied, or found applied: a redelivery proposes them again, and a merge's
    event id keeps it to one), asked once for the batch (its events are one record's)
    and sent with the last such result."""
    settled = [
        n
        for n, (event, result) in enumerate(zip(events, results, strict=False))
        if event.identities and result.outcome in ("applied", "duplicate")
    ]
    if not settled:
        return results
    last = settled[-1]
    identities = tuple(dict.fromkeys(i for n in settled for i in events[n].identities))
    asking = events[last].model_copy(update={"identities": identities})
    proposed = await store.io.store(
        lambda s: proposals(asking, shards, records=s, identities=s, journal=s)
    )
    if not proposed:
        return results
    out = list(results)
    out[last] = replace(out[last], sends=out[last].sends + proposed)
    return out


def proposals(
    event: Event,
    shards: ShardMap,
    *,
    records: RecordStore,
    identities: IdentityStore,
    journal: JournalStore,
) -> tuple[Event, ...]:
    """(In a pool thread, after ``event`` was applied or found applied.) A close for each
    live record one of ``event``'s identities names besides its own (the index says which,
    ``records`` where each chain of tombstones ends), unless a person kept the two apart or
    the pair's close was decided already (reviewed: in the ``journal``); the older record
    survives. (An event of a task: the two keys of its records elsewhere.)"""
    if not event.identities:
        return ()
    named = set(identities.identity_owners(event.identities).values()) - {event.record_key}
    if not named:
        return ()
    mine = live_end(records, event.record_key)
    found: list[Event] = []
    for key in sorted(named):
        other = live_end(records, key)
        if not (mine.exists and other.exists) or other.key == mine.key:
            continue
        if mine.kept_for != other.kept_for:
            continue  # a task's record and keylane's (or another task's): never one
        if identities.kept_apart(mine.key, other.key):
            continue
        survivor, absorbed = survivor_first(
            (mine.key, mine.created_at), (other.key, other.created_at)
        )
        if journal.journal(MERGE_SOURCE, merge_event_id(absorbed, survivor, "close", None)):
            continue  # decided already: a review row waits for a person
        found.append(
            merge_event(shards, "close", absorbed, survivor, destination=event.destination)
        )
    return tuple(found)


def forward(events: Sequence[Event], tombstone: Record, shards: ShardMap) -> list[ApplyResult]:
    """``events`` of a tombstone, each sent on to the record that absorbed it (the next
    step only: its own queued events go before them there, so each sender's events keep
    their order); the journal entry is the survivor's lane's to write."""
    survivor = tombstone.merged_into
    assert survivor is not None
    shard = shards.shard_for_key(survivor)
    out = []
    for event in events:
        sent = event.model_copy(
            update={"record_key": survivor, "shard": shard, "via": event.via or event.record_key}
        )
        out.append(ApplyResult("forwarded", sends=(sent,), counted_as="forwarded"))
    return out


async def close(
    store: LaneStore, event: Event, fence: Fence | None, rules: ApplyRules
) -> ApplyResult:
    """Close the absorbed record into its survivor, or review the pair (see the module
    docstring). Redelivered after its commit, it sends the absorb again."""
    merge, shards = event.merge, rules.shards
    assert merge is not None
    (entry,) = await store.journal([event])
    if entry is not None:
        tombstone = await store.read(event.record_key)
        sends: tuple[Event, ...] = ()
        if entry.outcome == "applied" and tombstone.merged_into is not None:
            take = (entry.result or {}).get("take", merge.take)
            sends = (_absorb_of(merge, tombstone.merged_into, shards, take),)
        return ApplyResult("duplicate", sends=sends)
    absorbed = await store.io.store(live_end, event.record_key)
    survivor = await store.io.store(live_end, merge.survivor)
    if not (absorbed.exists and survivor.exists) or absorbed.key == survivor.key:
        return await settle(store, event, fence, {"merge": "already one record"})
    if absorbed.kept_for != survivor.kept_for:  # (a pair as it is now, after a chain)
        return await settle(store, event, fence, {"merge": "records of two kinds"})
    first, second = survivor_first(
        (absorbed.key, absorbed.created_at), (survivor.key, survivor.created_at)
    )
    if second != event.record_key:
        # Either record was merged meanwhile: the pair as it is now is merged instead. A
        # person's choices were for the pair as it was: they do not go with it (fields that
        # differ in the pair as it is now are reviewed again).
        again = merge_event(
            shards, "close", second, first, None, merge.review_of, merge.destination
        )
        return await settle(store, event, fence, {"merge": "moved on"}, (again,))
    if await store.io.store(_kept_apart, absorbed.key, survivor.key):
        return await settle(store, event, fence, {"merge": "kept apart"}, (), "merges_kept_apart")
    differ = differing(absorbed.fields, survivor.fields, merge.take)
    decided: dict[str, Side] = {}
    if differ and rules.field_owners:
        owners = rules.field_owners
        decided = await store.io.store(owner_sides, absorbed, survivor, differ, owners)
        differ = {name: sides for name, sides in differ.items() if name not in decided}
    if differ:
        return await store.io.store(_review, event, fence, absorbed, survivor, differ)
    take = {**(merge.take or {}), **decided} or None
    result: dict[str, Any] = {"merged_into": survivor.key}
    if take:
        result["take"] = take
    write = replace(
        event_write(event, absorbed.fields, absorbed.revision, 1),
        merged_into=survivor.key,
        result=result,
    )
    try:
        revision = await store.commit([write], fence)
    except AlreadyApplied:
        return ApplyResult("duplicate")  # a redelivery meets it next time, as above
    if rules.faults:  # closed, the absorb not sent yet
        await store.io.call(rules.faults.hit, "merge.closed", event.record_key)
    return ApplyResult(
        "applied",
        attempts=1,
        revision=revision,
        result=result,
        sends=(_absorb_of(merge, survivor.key, shards, take),),
        counted_as="merged",
    )


def _absorb_of(
    merge: Merge, survivor: str, shards: ShardMap, take: dict[str, Side] | None
) -> Event:
    return merge_event(
        shards, "absorb", merge.absorbed, survivor, take, merge.review_of, merge.destination
    )


async def absorb(
    store: LaneStore, event: Event, fence: Fence | None, rules: ApplyRules
) -> ApplyResult:
    """The survivor takes what the absorbed record has and it lacks (or a person chose
    for it), and the identities that named the absorbed record, in one transaction; the
    journal result says what it took and what that replaced."""
    merge, faults = event.merge, rules.faults
    assert merge is not None
    for attempt in range(1, rules.max_attempts + 1):
        survivor = await store.read(event.record_key)
        if survivor.merged_into is not None:  # merged on in turn: its survivor absorbs
            (forwarded,) = forward([event], survivor, rules.shards)
            return forwarded
        tombstone = await store.read(merge.absorbed)
        fields, taken, replaced, kept = taken_fields(tombstone.fields, survivor.fields, merge.take)
        moved = await store.io.store(_identities_of, merge.absorbed)  # for an undo
        result = {
            "absorbed": merge.absorbed,
            "fields": taken,
            "replaced": replaced,  # for an undo: the survivor's own values it gives back
            "kept": kept,
            "identities": moved,
        }
        write = replace(
            event_write(event, fields, survivor.revision, attempt),
            absorbs=merge.absorbed,
            result=result,
        )
        if faults:
            await store.io.store(before_write, faults, "merge.absorbing", event.record_key)
        outcome = await commit_attempt(store, write, fence, attempt)
        if outcome is None:
            continue
        if faults and outcome.outcome == "applied":
            await store.io.call(faults.hit, "merge.absorbed", event.record_key)
        return outcome
    raise VersionConflict(event.record_key, 0, 0)  # outside edits on every attempt: again


async def commit_attempt(
    store: LaneStore, write: EventWrite, fence: Fence | None, attempt: int
) -> ApplyResult | None:
    """One attempt at a merge's write (an absorb, or its release): applied, a duplicate
    (its journal row is there), or None when the survivor moved since it was read (the
    caller reads it again). Conflicts before it count as for any event's write."""
    try:
        revision = await store.commit([write], fence)
    except VersionConflict:
        return None
    except AlreadyApplied:
        return ApplyResult("duplicate", attempts=attempt, conflicts=attempt - 1)
    return ApplyResult(
        "applied", attempts=attempt, conflicts=attempt - 1, revision=revision, result=write.result
    )


async def settle(
    store: LaneStore,
    event: Event,
    fence: Fence | None,
    result: dict[str, Any],
    sends: tuple[Event, ...] = (),
    counted_as: str | None = None,
) -> ApplyResult:
    """Journal a close that merges nothing (nothing to merge, kept apart, or sent on as
    the pair is now), with what it sends."""
    try:
        await store.commit([event_write(event, None, 0, 1, result=result)], fence)
    except AlreadyApplied:
        return ApplyResult("duplicate")
    return ApplyResult("applied", attempts=1, result=result, sends=sends, counted_as=counted_as)


def _kept_apart(store: IdentityStore, a: str, b: str) -> bool:
    return store.kept_apart(a, b)


def _identities_of(store: IdentityStore, record_key: str) -> list[str]:
    return store.identities_of(record_key)


def _review(
    store: DeadLetterStore,
    event: Event,
    fence: Fence | None,
    absorbed: Record,
    survivor: Record,
    differ: dict[str, dict[str, Any]],
) -> ApplyResult:
    """(In a pool thread.) The review row of a merge whose records differ: both sides,
    field by field; the close is journaled as dead-lettered with it (one row per pair)."""
    names = ", ".join(sorted(differ))
    draft = DeadLetterDraft(
        source=event.source,
        event_id=event.event_id,
        record_key=absorbed.key,
        shard=event.shard,
        reason=MERGE_REVIEW,
        event=event.model_dump(mode="json"),
        attempted_change={
            "absorbed": {"key": absorbed.key, "revision": absorbed.revision},
            "survivor": {"key": survivor.key, "revision": survivor.revision},
            "differ": differ,
            "absorbed_fields": absorbed.fields,
            "survivor_fields": survivor.fields,
        },
        revision_read=absorbed.revision,
        revision_found=survivor.revision,
        attempts=1,
        error=f"{absorbed.key} and {survivor.key} differ in {names}: a person decides",
    )
    try:
        row = store.commit_dead_letter(draft, fence)
    except AlreadyApplied:
        return ApplyResult("duplicate")
    return ApplyResult(
        "dead_lettered",
        attempts=1,
        dead_letter_id=row,
        reason=MERGE_REVIEW,
        counted_as="merge_reviews",
    )

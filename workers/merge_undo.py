"""A merge undone, through both lanes again (``keylane merges undo``, which a person runs;
what a merge is: :mod:`keylane.routing.contract.identities`, how it goes:
:mod:`keylane.workers.merges`).

* **reopen**, in the absorbed record's lane: the tombstone is a live record again, with its
  fields as its close left them, and the pair is kept apart for good, in one transaction;
  the release goes to the survivor's lane (:func:`reopen`).
* **release**, in the survivor's lane: it gives back the fields its absorb took that it
  still holds as taken, and the identities that came with the absorbed record name it
  again (:func:`release`).

Like a merge's steps, each is written with its journal entry in one transaction, and a
redelivery sends again what it sends.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..routing.contract.errors import AlreadyApplied, VersionConflict
from ..routing.contract.events import Event
from ..routing.contract.identities import MERGE_SOURCE, merge_event_id
from .apply_rules import ApplyRules
from .faults import before_write
from .lane_store import LaneStore, event_write
from .merges import commit_attempt, merge_event, settle
from .results import ApplyResult
from .store import JournalStore
from .store_rows import Fence, JournalEntry


async def reopen(
    store: LaneStore, event: Event, fence: Fence | None, rules: ApplyRules
) -> ApplyResult:
    """(A merge undone, in the absorbed record's lane.) The tombstone is live again, kept
    apart from its survivor, in one transaction; the release goes to the survivor's lane.
    Redelivered after its commit, it sends the release again."""
    merge = event.merge
    assert merge is not None
    release_event = merge_event(
        rules.shards, "release", merge.absorbed, merge.survivor, None, merge.review_of
    )
    (entry,) = await store.journal([event])
    if entry is not None:
        reopened = entry.outcome == "applied" and (entry.result or {}).get("reopened")
        return ApplyResult("duplicate", sends=(release_event,) if reopened else ())
    tombstone = await store.read(event.record_key)
    if tombstone.merged_into != merge.survivor:
        found = tombstone.merged_into or "none: it is live"
        return await settle(store, event, fence, {"merge": f"not merged into it ({found})"})
    result = {"reopened": True, "survivor": merge.survivor}
    write = replace(
        event_write(event, None, tombstone.revision, 1, result=result), reopens=merge.survivor
    )
    try:
        await store.commit([write], fence)
    except AlreadyApplied:
        return ApplyResult("duplicate")
    if rules.faults:  # reopened, the release not sent yet
        await store.io.call(rules.faults.hit, "merge.reopened", event.record_key)
    return ApplyResult(
        "applied", attempts=1, result=result, sends=(release_event,), counted_as="merges_undone"
    )


async def release(
    store: LaneStore, event: Event, fence: Fence | None, rules: ApplyRules
) -> ApplyResult:
    """(A merge undone, in the survivor's lane.) The survivor gives back the fields its
    absorb took that it still holds as taken (one changed since stays), and the identities
    that came with the absorbed record name it again, in one transaction."""
    merge = event.merge
    assert merge is not None
    absorbed_id = merge_event_id(merge.absorbed, merge.survivor, "absorb", merge.review_of)
    absorbed = await store.io.store(_entry, absorbed_id)
    took = (absorbed.result or {}) if absorbed is not None else {}
    taken: dict[str, Any] = dict(took.get("fields") or {})
    identities = tuple(took.get("identities") or ())
    for attempt in range(1, rules.max_attempts + 1):
        survivor = await store.read(event.record_key)
        if survivor.merged_into is not None:  # merged on since: a person gives back there
            note = f"{survivor.key} was merged into {survivor.merged_into} since"
            return await settle(store, event, fence, {"merge": note, "gave_back": {}})
        given = {k: v for k, v in taken.items() if k in survivor.fields and survivor.fields[k] == v}
        fields = {k: v for k, v in survivor.fields.items() if k not in given}
        result = {"released": merge.absorbed, "gave_back": given, "identities": list(identities)}
        write = replace(
            event_write(event, fields if given else None, survivor.revision, attempt),
            result=result,
            releases=(merge.absorbed, identities),
        )
        if rules.faults:
            await store.io.store(before_write, rules.faults, "merge.releasing", event.record_key)
        outcome = await commit_attempt(store, write, fence, attempt)
        if outcome is not None:
            return outcome
    raise VersionConflict(event.record_key, 0, 0)  # outside edits on every attempt: again


def _entry(store: JournalStore, event_id: str) -> JournalEntry | None:
    return store.journal(MERGE_SOURCE, event_id)

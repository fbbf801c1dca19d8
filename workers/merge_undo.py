"""A merge undone, through both lanes again (``keylane merges undo``, which a person runs;
what a merge is: :mod:`keylane.routing.contract.identities`, how it goes:
:mod:`keylane.workers.merges`).

* **reopen**, in the absorbed record's lane: the tombstone is a live record again, with its
  fields as its close left them, and the pair is kept apart for good, in one transaction;
  the release goes to the survivor's lane (:func:`reopen`).
* **release**, in the survivor's lane: each field its absorb took goes back to what the
  survivor held before: its own value (**restored**), or none (**removed**); unless it
  changed since (a journal entry after the absorb wrote it, or its value is not the one
  taken: an outside edit), then it is **kept** and the result says why, or nothing says
  what the survivor held (**unknown**), then it stays as it is: a release never removes a
  value it cannot account for. The identities that came with the absorbed record name it
  again (:func:`release`, :func:`undone_fields`).
* What the survivor held before is in the absorb's journal result (``replaced``); an
  absorb journaled before absorbs kept it says less: :func:`gives_back_of`.

Like a merge's steps, each is written with its journal entry in one transaction, and a
redelivery sends again what it sends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ..routing.contract.errors import AlreadyApplied, VersionConflict
from ..routing.contract.events import Event
from ..routing.contract.identities import (
    MERGE_SOURCE,
    GiveBack,
    Merge,
    merge_event_id,
    review_of_step,
)
from .apply_rules import ApplyRules
from .faults import before_write
from .lane_store import LaneStore, event_write
from .merges import commit_attempt, merge_event, settle
from .results import ApplyResult
from .store import DeadLetterStore, JournalStore
from .store_rows import MERGE_REVIEW, Fence, JournalEntry

#: A field the record does not hold (``None`` is a value a field may hold).
_ABSENT = object()


async def reopen(
    store: LaneStore, event: Event, fence: Fence | None, rules: ApplyRules
) -> ApplyResult:
    """(A merge undone, in the absorbed record's lane.) The tombstone is live again, kept
    apart from its survivor, in one transaction; the release goes to the survivor's lane.
    Redelivered after its commit, it sends the release again."""
    merge = event.merge
    assert merge is not None
    release_event = merge_event(
        rules.shards,
        "release",
        merge.absorbed,
        merge.survivor,
        None,
        merge.review_of,
        gives_back=merge.gives_back,
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
    """(A merge undone, in the survivor's lane.) Each field its absorb took goes back to
    what the survivor held before, unless it changed since (see the module docstring),
    and the identities that came with the absorbed record name it again, in one
    transaction; the journal result says what was restored, removed, kept and why."""
    merge = event.merge
    assert merge is not None
    back = merge.gives_back
    if back is None:  # a reopen queued before the undo's steps carried it
        back = await store.io.store(lambda s: _in_store(s, s, merge))
    since = await store.io.store(written_since, event.record_key, back)
    for attempt in range(1, rules.max_attempts + 1):
        survivor = await store.read(event.record_key)
        if survivor.merged_into is not None:  # merged on since: a person gives back there
            note = f"{survivor.key} was merged into {survivor.merged_into} since"
            return await settle(store, event, fence, {"merge": note})
        fields, undone = undone_fields(survivor.fields, back, since)
        result = {"released": merge.absorbed, **undone, "identities": list(back.identities)}
        changed = fields if fields != survivor.fields else None
        write = replace(
            event_write(event, changed, survivor.revision, attempt),
            result=result,
            releases=(merge.absorbed, back.identities),
        )
        if rules.faults:
            await store.io.store(before_write, rules.faults, "merge.releasing", event.record_key)
        outcome = await commit_attempt(store, write, fence, attempt)
        if outcome is not None:
            return outcome
    raise VersionConflict(event.record_key, 0, 0)  # outside edits on every attempt: again


def undone_fields(
    fields: Mapping[str, Any], back: GiveBack, since: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The survivor's fields once it gives back what ``back`` says its absorb took, and
    what became of each of those fields: ``restored`` (name: its own value again),
    ``removed`` (it had none before), ``kept`` (name: its value now, the event that wrote
    it since as ``by`` when ``since`` names one, and why), ``unknown`` (name: its value,
    left as it is: nothing says what it had)."""
    after = dict(fields)
    restored: dict[str, Any] = {}
    removed: list[str] = []
    kept: dict[str, dict[str, Any]] = {}
    unknown: dict[str, Any] = {}
    for name, took in sorted(back.took.items()):
        now = after.get(name, _ABSENT)
        if name in since or now != took:
            kept[name] = _kept(now, since.get(name))
        elif name in back.unknown:
            unknown[name] = now
        elif name in back.replaced:
            after[name] = restored[name] = back.replaced[name]
        else:
            del after[name]
            removed.append(name)
    return after, {"restored": restored, "removed": removed, "kept": kept, "unknown": unknown}


def _kept(now: Any, by: str | None) -> dict[str, Any]:
    what = "removed" if now is _ABSENT else "changed"
    why = f"{what} since the merge, " + (f"by {by}" if by else "by no event in the journal")
    return {**({} if now is _ABSENT else {"value": now}), "by": by, "why": why}


def written_since(store: JournalStore, record_key: str, back: GiveBack) -> dict[str, str]:
    """(In a pool thread.) The last journal entry (``source/event id``) that wrote each
    field ``back`` took on ``record_key`` after its absorb (an applied change's result
    names the fields it wrote)."""
    if back.revision is None or not back.took:
        return {}
    found: dict[str, str] = {}
    for entry in store.journal_entries(record_key):  # by revision: the last one wins
        written = (entry.result or {}).get("fields")
        if entry.outcome != "applied" or (entry.revision or 0) <= back.revision:
            continue
        if isinstance(written, dict):
            found.update({n: f"{entry.source}/{entry.event_id}" for n in back.took if n in written})
    return found


def gives_back_of(
    absorb: JournalEntry,
    find: Callable[[str], JournalEntry | None],
    reviews: DeadLetterStore,
) -> GiveBack:
    """What undoing the merge of the absorb journaled as ``absorb`` gives back: what it
    took, and what the survivor held before, from its result (``replaced``). An absorb
    journaled before absorbs kept that says it another way: a field no one chose the
    absorbed side of (the close's ``take``, from ``find``: its journal entry by event
    id) was taken because the survivor lacked it; one a person chose had the value the
    pair's review row shows (its ``survivor_fields``); for any other, nothing says
    (unknown)."""
    result = absorb.result or {}
    took = dict(result.get("fields") or {})
    identities = tuple(result.get("identities") or ())
    replaced = result.get("replaced")
    if isinstance(replaced, dict):
        return GiveBack(
            took=took, replaced=replaced, identities=identities, revision=absorb.revision
        )
    absorbed, survivor = str(result.get("absorbed")), absorb.record_key
    review_of = review_of_step(absorb.event_id)
    close = find(merge_event_id(absorbed, survivor, "close", review_of))
    chose = None if close is None or close.outcome != "applied" else close.result or {}
    take = None if chose is None else dict(chose.get("take") or {})
    before = _review_fields(reviews, review_of, survivor)
    said: dict[str, Any] = {}
    unknown: list[str] = []
    for name in sorted(took):
        if take is not None and take.get(name) != "absorbed":
            continue  # taken because the survivor lacked it
        if before is not None and name in before:
            said[name] = before[name]
        else:
            unknown.append(name)
    return GiveBack(
        took=took,
        replaced=said,
        unknown=tuple(unknown),
        identities=identities,
        revision=absorb.revision,
    )


def _review_fields(
    reviews: DeadLetterStore, review_of: int | None, survivor: str
) -> dict[str, Any] | None:
    """The survivor's fields as the pair's review row showed them, if it still has it."""
    row = None if review_of is None else reviews.dead_letter(review_of)
    if row is None or row.reason != MERGE_REVIEW:
        return None
    change = row.attempted_change
    if (change.get("survivor") or {}).get("key") != survivor:
        return None  # a review of the pair as it was before a chain moved it on
    fields = change.get("survivor_fields")
    return dict(fields) if isinstance(fields, dict) else None


def _in_store(journal: JournalStore, reviews: DeadLetterStore, merge: Merge) -> GiveBack:
    """(In a pool thread.) What the release of ``merge`` gives back, read from the store's
    journal and review rows."""
    absorb_id = merge_event_id(merge.absorbed, merge.survivor, "absorb", merge.review_of)
    absorb = journal.journal(MERGE_SOURCE, absorb_id)
    if absorb is None or absorb.outcome != "applied":
        return GiveBack()
    return gives_back_of(absorb, lambda event_id: journal.journal(MERGE_SOURCE, event_id), reviews)

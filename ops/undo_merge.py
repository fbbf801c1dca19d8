"""A merge undone by a person (``keylane merges undo KEY``; how the two lanes do it:
``workers/merge_undo.py``).

The command finds the absorb of the merge in the survivor's journal, or in the archive once
the prune moved it there, and reads from it what the survivor gives back: each field the
absorb took, and what the survivor held of it before (its own value, or none). It queues
the reopen of the absorbed record with that, in the absorbed record's lane; the reopen
sends the release to the survivor's lane. It then waits for the release's journal entry
(``--wait``) and says, field by field, what the survivor got back (restored, removed),
what it kept (a later event or an edit changed the field since: which one) and what it
left because nothing says what it held before (an absorb journaled before absorbs kept
it, and no review row of the pair).

A task's merge was made by its ``on_merge`` where the records are: keylane cannot split
it (undo it there). In a chain (A into B, then B into C) the last merge is undone first:
the undo of A into B is refused while B is merged into C, since B's release could give
nothing back (B is a tombstone) and A's identities would stay with C.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields
from typing import Any

from ..routing.contract.errors import KeylaneError
from ..routing.contract.identities import (
    MERGE_SOURCE,
    GiveBack,
    merge_event_id,
    review_of_step,
)
from ..routing.contract.message import build_event_message
from ..workers.merge_undo import gives_back_of
from ..workers.merges import merge_event
from ..workers.store import DeadLetterStore, JournalStore, RecordStore
from ..workers.store_rows import ARCHIVED, JournalEntry
from .archive import Archive
from .lookup import find_events
from .tables import render_table
from .triage import TriageBroker

#: How often the command looks for the release's journal entry while it waits.
POLL_S = 0.2


@dataclass(frozen=True)
class Undoing:
    """An undo queued: the pair, what the survivor gives back, its two steps' event ids,
    and whether this call queued it (False: an earlier call did)."""

    absorbed: str
    survivor: str
    gives_back: GiveBack
    reopen_id: str
    release_id: str
    queued: bool


def undo(
    records: RecordStore,
    journal: JournalStore,
    reviews: DeadLetterStore,
    archive: Archive,
    broker: TriageBroker,
    absorbed: str,
) -> Undoing:
    """Queue the reopen of the tombstone ``absorbed`` (once per pair), carrying what its
    survivor gives back; :class:`KeylaneError` for a record merged into none, a merge
    still under way, a task's, or one whose survivor was merged on since (undone last
    first)."""
    tombstone = records.read(absorbed)
    survivor = tombstone.merged_into
    if survivor is None:
        what = "is not merged into another record" if tombstone.exists else "has no record"
        raise KeylaneError(f"{absorbed} {what}: nothing to undo")
    if tombstone.kept_for is not None:
        raise KeylaneError(
            f"{absorbed} is a key of {tombstone.kept_for}, merged into {survivor} by its "
            "on_merge where its records are: keylane holds no fields of them to give back "
            "(undo it there)"
        )
    onward = records.read(survivor).merged_into
    if onward is not None:
        # Its release would find the survivor a tombstone and give nothing back, and the
        # identities that came with the absorbed record would stay with ``onward``.
        raise KeylaneError(
            f"{absorbed} was merged into {survivor}, which was merged into {onward} since: "
            f"undo that merge first (keylane merges undo {survivor}), then this one"
        )
    entry = _absorb_entry(journal, archive, absorbed, survivor)
    if entry is None:
        raise KeylaneError(
            f"the merge of {absorbed} into {survivor} is under way (its absorb is not in "
            f"{survivor}'s journal yet): try again in a moment"
        )
    back = gives_back_of(entry, lambda event_id: _journaled(journal, archive, event_id), reviews)
    review_of = review_of_step(entry.event_id)
    event = merge_event(
        broker.shards, "reopen", absorbed, survivor, None, review_of, gives_back=back
    )
    message = build_event_message(event, broker.shards.queue_name(event.shard))
    queued = broker.push_once(f"undo:{event.event_id}", event.shard, message)
    release_id = merge_event_id(absorbed, survivor, "release", review_of)
    return Undoing(absorbed, survivor, back, event.event_id, release_id, queued)


def wait_undone(journal: JournalStore, undoing: Undoing, wait_s: float) -> JournalEntry | None:
    """The journal entry that ends ``undoing``, waiting up to ``wait_s`` for it: the
    release's, or the reopen's when it released nothing (the record was not merged into
    that survivor any more); None when neither is there in time."""
    deadline = time.monotonic() + wait_s
    while True:
        release = journal.journal(MERGE_SOURCE, undoing.release_id)
        if release is not None:
            return release
        reopen = journal.journal(MERGE_SOURCE, undoing.reopen_id)
        if reopen is not None and not (reopen.result or {}).get("reopened"):
            return reopen
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)


@dataclass(frozen=True)
class UndoReport:
    """What ``merges undo`` says: the outcome, a line of detail, and the release's result
    (what was restored, removed, kept and left) once it is applied."""

    undoing: Undoing
    outcome: str
    detail: str
    released: dict[str, Any] | None = None

    @classmethod
    def of(cls, undoing: Undoing, entry: JournalEntry | None, wait_s: float) -> UndoReport:
        """The report of ``undoing``, ended by ``entry`` (see :func:`wait_undone`)."""
        pair = f"{undoing.absorbed} out of {undoing.survivor}"
        result = (entry.result or {}) if entry is not None else {}
        if entry is not None and "released" in result:
            back = ", ".join(result.get("identities") or ()) or "none"
            detail = f"{pair}, kept apart for good; identities back: {back}"
            return cls(undoing, "released", detail, result)
        if entry is not None and entry.event_id == undoing.release_id:  # merged on since
            live = f"{undoing.absorbed} is live again, kept apart"
            return cls(undoing, "not released", f"{result.get('merge')}; {live}")
        if entry is not None:
            return cls(undoing, "not undone", f"{pair}: {result.get('merge')}")
        took = ", ".join(sorted(undoing.gives_back.took)) or "no fields"
        named = len(undoing.gives_back.identities)
        detail = f"{pair}: {took} and {named} identities go back; kept apart"
        queued = "queued" if undoing.queued else "already queued"
        if not wait_s:
            return cls(undoing, queued, detail)
        late = f"not released within {wait_s:g} s (keylane journal find --key {undoing.survivor})"
        return cls(undoing, "pending", f"{queued}: {detail}; {late}")

    @property
    def exit_code(self) -> int:
        """0 released (or queued, when asked not to wait), 1 otherwise."""
        return 0 if self.outcome in ("released", "queued", "already queued") else 1

    def as_json(self) -> dict[str, Any]:
        """What ``merges undo --json`` prints."""
        out: dict[str, Any] = {
            "record_key": self.undoing.absorbed,
            "survivor": self.undoing.survivor,
            "outcome": self.outcome,
            "detail": self.detail,
        }
        if self.released is not None:
            parts = ("restored", "removed", "kept", "unknown", "identities")
            out.update({part: self.released.get(part) for part in parts})
        return out

    def lines(self) -> list[str]:
        """What ``merges undo`` prints: the outcome, then field by field what became of
        each field the merge took."""
        first = f"{self.outcome}: {self.detail}"
        if self.released is None:
            return [first]
        rows = _field_rows(self.released)
        if not rows:
            return [first, "no fields to give back"]
        return [first, render_table(["field", "now", "undo", "why"], rows)]


def _field_rows(released: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """A row per field the merge took: its value now, what the undo did, and why."""
    rows = [(n, _shown(v), "restored", "its own value before the merge")
            for n, v in (released.get("restored") or {}).items()]  # fmt: skip
    rows += [(n, "(absent)", "removed", "it had none before the merge")
             for n in released.get("removed") or ()]  # fmt: skip
    rows += [(n, _shown(k.get("value"), "value" in k), "kept", str(k.get("why")))
             for n, k in (released.get("kept") or {}).items()]  # fmt: skip
    unknown = "what it had before the merge is not known"
    rows += [(n, _shown(v), "left", unknown) for n, v in (released.get("unknown") or {}).items()]
    return sorted(rows)


def _shown(value: Any, present: bool = True) -> str:
    return json.dumps(value, ensure_ascii=False) if present else "(absent)"


def _journaled(journal: JournalStore, archive: Archive, event_id: str) -> JournalEntry | None:
    """A merge step's journal entry: the table's, else the archive's."""
    entry = journal.journal(MERGE_SOURCE, event_id)
    if entry is not None and entry.outcome != ARCHIVED:
        return entry
    found = find_events(journal, archive, event_id, MERGE_SOURCE).found
    return _entry(found[-1].row) if found else None


def _absorb_entry(
    journal: JournalStore, archive: Archive, absorbed: str, survivor: str
) -> JournalEntry | None:
    """The journal entry of the absorb of ``absorbed`` into ``survivor`` (its event id
    names the pair, and the review row a person resolved, if any): the table's, else the
    archive's (every day of the survivor's rows there)."""
    entry = journal.journal(MERGE_SOURCE, merge_event_id(absorbed, survivor, "absorb", None))
    if entry is not None and entry.outcome != ARCHIVED:
        return entry
    for entry in reversed(journal.journal_entries(survivor)):
        if _is_absorb_of(entry, absorbed):
            return entry
    found = find_events(journal, archive, None, MERGE_SOURCE, survivor).found
    archived = [_entry(f.row) for f in found if f.where != "table"]
    return next((e for e in reversed(archived) if _is_absorb_of(e, absorbed)), None)


def _is_absorb_of(entry: JournalEntry, absorbed: str) -> bool:
    absorb = entry.source == MERGE_SOURCE and entry.event_id.startswith("absorb-")
    return absorb and (entry.result or {}).get("absorbed") == absorbed


_ENTRY_FIELDS = frozenset(f.name for f in fields(JournalEntry))


def _entry(row: dict[str, Any]) -> JournalEntry:
    """A journal row found by ``journal find`` (an archived one lacks the columns added
    after it was archived: their defaults)."""
    return JournalEntry(**{k: v for k, v in row.items() if k in _ENTRY_FIELDS})

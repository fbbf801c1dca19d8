"""A merge a person decides: the two records side by side, a side chosen per field, or the
two kept apart for good (``keylane merges``; what a merge is:
``routing/contract/identities.py``).

A merge whose records differ in a field is never applied by itself: its close is a review
row (reason ``merge_review``) holding both records' fields as they were, and both records
go on receiving their own events. A person then either

* **resolves** it: a side for each field that differs (``--take company=survivor``); the
  close goes again through the absorbed record's lane, with those choices, compared on
  the records as they are then (a field that came to differ since is reviewed again, on a
  row of its own); or
* keeps the two **apart**: the pair is remembered in the store, and no merge of these two
  records is proposed again.

Either closes the row (resolved, with who, when and what was chosen). A merge applied,
resolved by a person or not, may be undone: ``ops/undo_merge.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

from ..routing.contract.errors import KeylaneError
from ..routing.contract.identities import Side
from ..routing.contract.message import build_event_message
from ..workers.merges import merge_event
from ..workers.store import DeadLetterStore, IdentityStore
from ..workers.store_rows import MERGE_REVIEW, DeadLetter
from .tables import render_table
from .triage import Handled, TriageBroker

SIDES: tuple[Side, ...] = ("absorbed", "survivor")


@dataclass(frozen=True)
class MergeSides:
    """A merge review row, read: the two records and the fields that differ."""

    row: DeadLetter
    absorbed: str
    survivor: str
    absorbed_fields: dict[str, Any]
    survivor_fields: dict[str, Any]
    differ: dict[str, dict[str, Any]]

    @classmethod
    def of(cls, row: DeadLetter) -> MergeSides:
        """The sides of a ``merge_review`` row; :class:`KeylaneError` for another row."""
        if row.reason != MERGE_REVIEW:
            raise KeylaneError(f"dead letter {row.id} is not a merge review ({row.reason})")
        change = row.attempted_change
        return cls(
            row,
            str(change["absorbed"]["key"]),
            str(change["survivor"]["key"]),
            dict(change.get("absorbed_fields") or {}),
            dict(change.get("survivor_fields") or {}),
            dict(change["differ"]),
        )

    def rows(self) -> list[tuple[str, str, str, str]]:
        """Field by field: (field, absorbed value, survivor value, mark), ``*`` where they
        differ, every field of either record."""
        names = sorted(set(self.absorbed_fields) | set(self.survivor_fields))
        return [
            (
                name,
                _shown(self.absorbed_fields, name),
                _shown(self.survivor_fields, name),
                "*" if name in self.differ else "",
            )
            for name in names
        ]

    def as_json(self) -> dict[str, Any]:
        """What ``merges show --json`` prints."""
        return {
            "id": self.row.id,
            "status": self.row.status,
            "absorbed": self.absorbed,
            "survivor": self.survivor,
            "differ": self.differ,
            "absorbed_fields": self.absorbed_fields,
            "survivor_fields": self.survivor_fields,
        }


def _shown(fields: dict[str, Any], name: str) -> str:
    return json.dumps(fields[name]) if name in fields else "(absent)"


def merge_lines(sides: MergeSides) -> list[str]:
    """The two records side by side, and how to decide (``merges show``, ``dlq show``)."""
    headers = ["field", f"absorbed: {sides.absorbed}", f"survivor: {sides.survivor}", ""]
    return [
        render_table(headers, sides.rows()),
        "",
        f"decide: keylane merges resolve {sides.row.id} --take FIELD=absorbed|survivor ..."
        f"  or  keylane merges apart {sides.row.id}",
    ]


def parse_take(items: tuple[str, ...], take_all: str | None, sides: MergeSides) -> dict[str, Side]:
    """The side chosen for each differing field: ``FIELD=absorbed|survivor`` items, and
    ``take_all`` for the fields not named. :class:`KeylaneError` when a field that differs
    has no side, or an item names a field that does not differ."""
    take: dict[str, Side] = {}
    for item in items:
        name, sep, side = item.partition("=")
        if not sep or side not in SIDES:
            raise KeylaneError(f"--take {item!r}: write FIELD=absorbed or FIELD=survivor")
        if name not in sides.differ:
            differ = ", ".join(sorted(sides.differ))
            raise KeylaneError(f"--take {item!r}: {name} does not differ (these do: {differ})")
        take[name] = side
    for name in sides.differ:
        if name not in take and take_all is not None:
            take[name] = cast(Side, take_all)
    missing = sorted(set(sides.differ) - set(take))
    if missing:
        raise KeylaneError(
            f"choose a side for {', '.join(missing)} (--take FIELD=absorbed|survivor, "
            "or --take-all absorbed|survivor)"
        )
    return take


def resolve(
    store: DeadLetterStore,
    broker: TriageBroker,
    sides: MergeSides,
    take: dict[str, Side],
    by: str,
) -> Handled:
    """Queue the close again with ``take`` (once per row), then close the row."""
    row = sides.row
    if row.status != "open":
        return Handled(row.id, "skipped", f"status is {row.status}")
    event = merge_event(broker.shards, "close", sides.absorbed, sides.survivor, take, row.id)
    queue = broker.shards.queue_name(event.shard)
    queued = broker.push_once(f"merge:{row.id}", event.shard, build_event_message(event, queue))
    chosen = ", ".join(f"{name}={side}" for name, side in sorted(take.items()))
    # Marked after the push: a crash in between leaves it open, and running it again
    # completes it without queueing a second close.
    store.set_dead_letter_status(row.id, "resolved", ("open",), by, f"merge: {chosen}")
    detail = f"{sides.absorbed} into {sides.survivor} ({chosen})"
    return Handled(row.id, "queued" if queued else "already queued", detail)


def keep_apart(
    identities: IdentityStore, rows: DeadLetterStore, sides: MergeSides, by: str, note: str | None
) -> Handled:
    """Remember the pair as two records (never proposed again), then close the row."""
    row = sides.row
    if row.status != "open":
        return Handled(row.id, "skipped", f"status is {row.status}")
    identities.keep_apart(sides.absorbed, sides.survivor, by)
    why = "kept apart" if note is None else f"kept apart: {note}"
    rows.set_dead_letter_status(row.id, "resolved", ("open",), by, why)
    return Handled(row.id, "closed", f"{sides.absorbed} and {sides.survivor} stay two records")


def open_review(store: DeadLetterStore, row_id: int) -> MergeSides:
    """The merge review row ``row_id``; :class:`KeylaneError` when there is none."""
    row = store.dead_letter(row_id)
    if row is None:
        raise KeylaneError(f"no dead letter with id {row_id}")
    return MergeSides.of(row)

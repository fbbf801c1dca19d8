"""Which values a merge compares and which it takes (the steps that use them:
:mod:`keylane.workers.merges`).

* :func:`differing`: the fields both records hold with different values (two spellings
  of one email or phone are one value), those a person chose a side for left out;
* :func:`owner_sides`: the side field ownership decides for a differing field, from the
  journal's last writer of each value;
* :func:`taken_fields`: what the survivor takes from the absorbed record (what it lacks,
  or what a person chose), what it replaces of its own (what an undo gives back), and
  what it keeps of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..routing.contract.identities import Side, same_value
from .store import JournalStore
from .store_rows import Record


def owner_sides(
    store: JournalStore,
    absorbed: Record,
    survivor: Record,
    differ: dict[str, dict[str, Any]],
    field_owners: Mapping[str, frozenset[str]],
) -> dict[str, Side]:
    """(In a pool thread.) The side whose value wins each differing field that field
    ownership decides: the record whose value was written by a source that owns the field
    by name, when the other's was not (both, neither, or not known: a person decides)."""
    names = [name for name in differ if name in field_owners]
    if not names:
        return {}
    by_absorbed = last_writers(store, absorbed, names)
    by_survivor = last_writers(store, survivor, names)
    sides: dict[str, Side] = {}
    for name in names:
        owners = field_owners[name]
        absorbed_owns = by_absorbed.get(name) in owners
        if absorbed_owns != (by_survivor.get(name) in owners):
            sides[name] = "absorbed" if absorbed_owns else "survivor"
    return sides


def last_writers(store: JournalStore, record: Record, names: Sequence[str]) -> dict[str, str]:
    """The source of the journal entry that last wrote each of ``names`` on ``record``,
    as far as its journal tells: "" when the value it wrote is not the record's any more
    (an outside edit since), absent when no entry in the journal wrote it (pruned)."""
    found: dict[str, str] = {}
    for entry in reversed(store.journal_entries(record.key)):
        written = (entry.result or {}).get("fields")
        if entry.outcome != "applied" or not isinstance(written, dict):
            continue
        for name in names:
            if name not in found and name in written:
                found[name] = entry.source if written[name] == record.fields.get(name) else ""
        if len(found) == len(names):
            break
    return found


def differing(
    absorbed: dict[str, Any], survivor: dict[str, Any], take: dict[str, Side] | None
) -> dict[str, dict[str, Any]]:
    """The fields both records hold with different values (two spellings of one email
    or phone are one value) that no person chose a side for: field -> {"absorbed": value,
    "survivor": value}."""
    chosen = take or {}
    return {
        name: {"absorbed": value, "survivor": survivor[name]}
        for name, value in absorbed.items()
        if name in survivor and not same_value(name, value, survivor[name]) and name not in chosen
    }


def taken_fields(
    absorbed: dict[str, Any], survivor: dict[str, Any], take: dict[str, Side] | None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The survivor's fields after it absorbs; the absorbed values it took; its own values
    those replaced (a person, or field ownership, chose the absorbed side: what an undo
    gives back; a field it took and lacked is not there); and the absorbed values it did
    not take (its own differ and nobody chose the absorbed side: a change since the
    close compared them; the tombstone keeps them, and so does the journal)."""
    fields = dict(survivor)
    taken: dict[str, Any] = {}
    replaced: dict[str, Any] = {}
    kept: dict[str, Any] = {}
    for name, value in absorbed.items():
        if name not in fields or (take or {}).get(name) == "absorbed":
            if fields.get(name, object()) != value:
                if name in fields:
                    replaced[name] = fields[name]
                fields[name] = value
                taken[name] = value
        elif not same_value(name, fields[name], value):
            kept[name] = value
    return fields, taken, replaced, kept

"""``keylane journal find``: what happened to an event id (or to a record's events),
looked up in the journal's table, then in the archive.

An event id whose row was archived is still remembered in ``archived_ids`` with the time
it was recorded, which names the archive's day folder: that day is read first, and only
when it does not hold the row (or the id is no longer remembered) is every day read,
newest first. A record's events (``--key``, with those forwarded from it: their ``via``
names it) are read from every day, and so is every day for an event id with ``--all``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..workers.store import JournalStore
from ..workers.store_rows import ARCHIVED
from .archive import Archive, day_of


@dataclass(frozen=True)
class Found:
    """One journal row: ``where`` is ``table``, or the archive file it is in."""

    where: str
    row: dict[str, Any]


@dataclass
class Lookup:
    """The rows found, and how much of the archive was read to find them."""

    found: list[Found]
    files_read: int = 0


def find_events(
    store: JournalStore,
    archive: Archive,
    event_id: str | None,
    source: str | None = None,
    record_key: str | None = None,
    sources: Iterable[str] = (),
    whole_archive: bool = False,
) -> Lookup:
    """Journal rows with ``event_id`` (of ``source``, or of any source) or of
    ``record_key`` (and those forwarded from it): the table's first, then the archive's.
    ``sources`` are the configured ones, asked (with the journal's) where an archived id
    was recorded. An event id found in the table, and not remembered as archived, is not
    looked for in the archive unless ``whole_archive`` (an id that came again after it was
    forgotten has rows in both)."""
    in_table = [Found("table", asdict(e)) for e in store.find_journal(event_id, source, record_key)]
    lookup = Lookup(list(in_table))
    if record_key is not None:
        for field in ("record_key", "via"):
            _scan(lookup, archive, field, record_key, None, event_id, source)
        return lookup
    assert event_id is not None
    days = _days_archived(store, event_id, source, sources)
    if days:
        _scan(lookup, archive, "event_id", event_id, days, event_id, source)
    if len(lookup.found) == len(in_table) and (days or not in_table or whole_archive):
        _scan(lookup, archive, "event_id", event_id, None, event_id, source)
    return lookup


def _scan(
    lookup: Lookup,
    archive: Archive,
    field: str,
    value: str,
    days: list[str] | None,
    event_id: str | None,
    source: str | None,
) -> None:
    """Add the archive's rows matching to ``lookup`` (a row already found is skipped:
    during a prune a row is briefly in a pending file and in the table too)."""
    seen = {_version(f.row) for f in lookup.found}

    def counted(_path: Path) -> None:
        lookup.files_read += 1

    for path, row in archive.search("journal", field, value, days, counted):
        key = _version(row)
        if key not in seen and _matches(row, event_id, source):
            seen.add(key)
            lookup.found.append(Found(str(path.relative_to(archive.root)), row))


def _days_archived(
    store: JournalStore, event_id: str, source: str | None, sources: Iterable[str]
) -> list[str]:
    """The archive days of ``event_id`` that ``archived_ids`` still remembers."""
    candidates = [source] if source is not None else {*sources, *store.journal_sources()}
    days = set()
    for name in candidates:
        entry = store.journal(name, event_id)
        if entry is not None and entry.outcome == ARCHIVED:
            days.add(day_of(entry.recorded_at))
    return sorted(days, reverse=True)


def _version(row: dict[str, Any]) -> tuple[Any, ...]:
    """A journal row's identity: its event and when it was recorded (an id applied again
    after it was forgotten has a row in the archive and another in the table)."""
    return (row.get("source"), row.get("event_id"), row.get("recorded_at"))


def _matches(row: dict[str, Any], event_id: str | None, source: str | None) -> bool:
    return (event_id is None or row.get("event_id") == event_id) and (
        source is None or row.get("source") == source
    )

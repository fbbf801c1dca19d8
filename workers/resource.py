"""Resources: records that live outside keylane, and the write discipline for them.

One concept under one name. A *resource* is a place that holds records with versions (an
HTTP API with ETags, the user's own PostgreSQL table, an API with a last-edited stamp): the
interface is :class:`VersionedResource` here, one file per kind in
:mod:`keylane.workers.resources`, their configuration in
:mod:`keylane.routing.contract.resources` (``[destinations.X]`` with ``kind = "etag"``,
``"pg_table"`` or ``"stamped"``), and the lane reaches them through
:mod:`keylane.workers.destinations.to_resource` (a source names one with ``records_in``;
user code with ``keylane.resource(name)``).

The discipline is :mod:`keylane.workers.apply`'s (invariants 5 and 6), written once for
every kind of resource:

1. **fresh read**: the record's fields and the version the resource gives them;
2. **change**: the event's operations applied to what was read, owned fields only; a change
   to a field the source does not own is refused before anything is read or written;
3. **conditional write**: only the changed fields (a resource that writes whole bodies
   merges them onto the body just read), written only if the resource is still at the
   version read; a record that was absent is created only if it is still absent;
4. **mismatch**: again from a fresh read, at most ``max_attempts`` times; then a
   :class:`Review` carrying the change, the version read, the version found and both
   bodies: what a dead-letter row holds.

A write whose answer is lost (a timeout, a reset connection, a 5xx) may or may not have
happened. A fresh read settles it when the version has not moved: the write did not happen
and is sent again, conditional on the same version, so at most one of the two can take
effect. When the version has moved, keylane cannot tell its own write from another and the
event becomes a review (``outcome_unknown``) instead of being applied twice.

One record key has one writer in keylane (its lane); the check is against everyone else.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..routing.contract.conditions import WireConditions
from ..routing.contract.errors import (
    ChangeNotApplicable,
    FieldNotOwned,
    ResourceError,
    ResourceRejected,
    ResourceUnavailable,
    StoreUnavailable,
    WriteConflict,
    WriteOutcomeUnknown,
)
from ..routing.contract.events import Change
from ..routing.contract.sources import ALL_FIELDS, FieldOwnership
from .changes import apply_changes
from .conditions import Unmet, check_conditions

#: A resource's version of a record: an integer revision, an ETag, a timestamp, a digest.
Version = int | str


@dataclass(frozen=True)
class Snapshot:
    """A record as read: its fields, its version (None: absent) and the resource's whole
    representation of it (what a whole-body write sends back)."""

    fields: dict[str, Any]
    version: Version | None
    document: Any = None

    @property
    def exists(self) -> bool:
        """Whether the resource has the record."""
        return self.version is not None


class VersionedResource(Protocol):
    """A place that holds records with versions. Implementations raise
    :class:`WriteConflict`, :class:`WriteOutcomeUnknown`, :class:`ResourceRejected` and
    :class:`ResourceUnavailable`, and nothing else on purpose."""

    def read(self, key: str) -> Snapshot:
        """The record as it is now."""

    def create(self, key: str, fields: Mapping[str, Any]) -> Version | None:
        """Create the record with ``fields``, only if it is absent (else
        :class:`WriteConflict`); return its version."""

    def update(self, key: str, fields: Mapping[str, Any], read: Snapshot) -> Version | None:
        """Write the changed ``fields`` (``None`` removes one) only if the record is still
        at ``read.version`` (else :class:`WriteConflict`); return the new version."""

    def close(self) -> None:
        """Release connections."""


@dataclass(frozen=True)
class Written:
    """The change is in the resource (``changed`` false: it already held these values)."""

    version: Version | None
    attempts: int
    conflicts: int
    created: bool = False
    changed: bool = True
    #: The fields written, with their new values (None: removed).
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Refused:
    """The event's conditions did not hold on the record as read: nothing was written."""

    unmet: Unmet
    version: Version | None
    attempts: int
    conflicts: int

    def result(self) -> dict[str, Any]:
        """The refusal's journal result (with the resource's version beside the revision)."""
        return {**self.unmet.as_result(), "version": self.version}


@dataclass(frozen=True)
class Review:
    """An event that did not apply, with what a person needs to decide on it."""

    reason: str  # conflict | outcome_unknown | not_owned | type | rejected
    error: str
    attempted_change: dict[str, Any]
    version_read: Version | None
    version_found: Version | None
    fields_read: dict[str, Any] | None
    fields_found: dict[str, Any] | None
    attempts: int
    conflicts: int = 0

    def dead_letter_fields(self) -> dict[str, Any]:
        """The fields of a dead-letter draft this result fills (the store keeps integer
        revisions: other versions are quoted in ``error``)."""
        return {
            "reason": self.reason,
            "attempted_change": self.attempted_change,
            "revision_read": revision_of(self.version_read),
            "revision_found": revision_of(self.version_found),
            "attempts": self.attempts,
            "error": self.error,
        }

    def detail(self) -> dict[str, Any]:
        """Everything, as JSON: both versions and both bodies."""
        return {
            "version_read": self.version_read,
            "version_found": self.version_found,
            "fields_read": self.fields_read,
            "fields_found": self.fields_found,
        }


def revision_of(version: Version | None) -> int | None:
    """An integer version as a revision (what a dead-letter row keeps), else None."""
    return version if isinstance(version, int) and not isinstance(version, bool) else None


#: An event's conditions on its record: ``(conditions, if_revision)``.
Conditions = tuple[WireConditions | None, int | None]

#: A change computed from the record as freshly read (a source's handler), or None.
ChangeFor = Callable[[Snapshot], "Mapping[str, Change] | None"]


#: Told the read a write is conditional on, right before it is sent, and None once a write
#: was answered: what a lane keeps so that a run after a crash knows a write was in doubt.
WriteNote = Callable[[Snapshot | None], None]


def apply_versioned(
    resource: VersionedResource,
    key: str,
    changes: Mapping[str, Change] | ChangeFor,
    ownership: FieldOwnership = ALL_FIELDS,
    source: str = "",
    max_attempts: int = 3,
    in_doubt: Snapshot | None = None,
    note_write: WriteNote | None = None,
    conditions: Conditions | None = None,
) -> Written | Review | Refused:
    """Apply ``changes`` to the record ``key`` of ``resource`` (see the module docstring).

    ``conditions`` (an event's ``(conditions, if_revision)``) are checked on every fresh
    read; unmet, nothing is written (:class:`Refused`); met, the write is conditional on
    that read's version, so a record that moved is read and checked again.

    ``in_doubt``: the read an earlier run's write was conditional on when that run ended
    without an answer (its process was killed): only an unmoved version proves that write
    did not happen; else the event is a review (``outcome_unknown``), never a second effect.
    ``note_write`` is told each read a write is about to be conditional on (see
    :data:`WriteNote`).

    Raises :class:`ResourceUnavailable` only when nothing was written: the event may be
    tried again later, from a fresh read.
    """
    run = _Apply(resource, key, changes, ownership, source, note_write)
    run.sent = in_doubt
    run.conditions = conditions
    return run.run(max_attempts)


class _Apply:
    """One event's attempts against one record."""

    def __init__(
        self,
        resource: VersionedResource,
        key: str,
        changes: Mapping[str, Change] | ChangeFor,
        ownership: FieldOwnership,
        source: str,
        note_write: WriteNote | None = None,
    ) -> None:
        self.resource = resource
        self.note_write = note_write or (lambda _: None)
        self.key = key
        self.changes = changes
        self.ownership = ownership
        self.source = source
        self.wire: dict[str, Any] = {} if callable(changes) else _wire(changes)
        self.conflicts = 0
        self.sent: Snapshot | None = None  # the read under a write whose answer was lost
        self.conditions: Conditions | None = None

    def run(self, max_attempts: int) -> Written | Review | Refused:
        if not callable(self.changes):
            stray = self.ownership.not_owned(self.changes)
            if stray:
                return self.review("not_owned", str(FieldNotOwned(self.source, stray)), None, 0)
        read: Snapshot | None = None
        for attempt in range(1, max_attempts + 1):
            if self.sent is None:
                read = self.resource.read(self.key)
            else:  # a write in doubt: only an unmoved version proves it did not happen
                read = self.found()
                if read is None or read.version != self.sent.version:
                    return self.unknown(self.sent, attempt, read)
            done = self.attempt(read, attempt)
            if done is not None:
                return done
        return self.exhausted(read, max_attempts)

    def attempt(self, read: Snapshot, attempt: int) -> Written | Review | Refused | None:
        """One read-change-write; None: the record moved, try again."""
        if self.conditions is not None:
            fields_if, if_revision = self.conditions
            revision = revision_of(read.version) if read.exists else 0
            unmet = check_conditions(fields_if, if_revision, read.fields, revision or 0)
            if unmet is not None:
                return Refused(unmet, read.version, attempt, self.conflicts)
        try:
            changes = self.changes_for(read)
            after = (
                {}
                if changes is None
                else apply_changes(read.fields, changes, self.ownership, self.source)
            )
        except FieldNotOwned as exc:
            return self.review("not_owned", str(exc), read, attempt)
        except ChangeNotApplicable as exc:
            return self.review("type", str(exc), read, attempt)
        changed = {} if changes is None else changed_fields(read.fields, after, changes)
        if not changed:
            return Written(read.version, attempt, self.conflicts, changed=False)
        self.note_write(read)
        try:
            version = self.write(read, changed)
        except WriteConflict:
            if self.sent is not None:
                return self.unknown(self.sent, attempt, self.found())
            self.note_write(None)
            self.conflicts += 1
            return None
        except WriteOutcomeUnknown:
            self.sent = read
            return None
        except ResourceRejected as exc:
            return self.review("rejected", str(exc), read, attempt, self.found())
        except ResourceUnavailable:
            if self.sent is not None:  # retried later from scratch, the doubt would be lost
                return self.unknown(self.sent, attempt, self.found())
            self.note_write(None)
            raise
        return Written(version, attempt, self.conflicts, created=not read.exists, fields=changed)

    def changes_for(self, read: Snapshot) -> Mapping[str, Change] | None:
        if not callable(self.changes):
            return self.changes
        changes = self.changes(read)
        self.wire = {} if changes is None else _wire(changes)
        return changes

    def write(self, read: Snapshot, changed: dict[str, Any]) -> Version | None:
        if read.exists:
            return self.resource.update(self.key, changed, read)
        return self.resource.create(self.key, {k: v for k, v in changed.items() if v is not None})

    def found(self) -> Snapshot | None:
        """The record now, for a review (None if it cannot be read)."""
        with contextlib.suppress(ResourceError, StoreUnavailable):
            return self.resource.read(self.key)
        return None

    def exhausted(self, read: Snapshot | None, attempts: int) -> Review:
        if self.sent is not None:
            return self.unknown(self.sent, attempts, self.found())
        found = self.found()
        moved = f"{_v(read)} to {_v(found)}"
        error = f"the record moved ({moved}) before the write on each of {attempts} attempts"
        return self.review("conflict", error, read, attempts, found)

    def unknown(self, sent: Snapshot, attempt: int, found: Snapshot | None) -> Review:
        error = (
            f"a write conditional on version {_v(sent)} got no answer, and the record is now "
            f"at {_v(found)}: it cannot be told whether that write took effect"
        )
        return self.review("outcome_unknown", error, sent, attempt, found)

    def review(
        self,
        reason: str,
        error: str,
        read: Snapshot | None,
        attempts: int,
        found: Snapshot | None = None,
    ) -> Review:
        found = found or read
        return Review(
            reason=reason,
            error=error,
            attempted_change=self.wire,
            version_read=None if read is None else read.version,
            version_found=None if found is None else found.version,
            fields_read=None if read is None else read.fields,
            fields_found=None if found is None else found.fields,
            attempts=attempts,
            conflicts=self.conflicts,
        )


def changed_fields(
    before: Mapping[str, Any], after: Mapping[str, Any], names: Mapping[str, Any]
) -> dict[str, Any]:
    """The fields among ``names`` whose value differs between ``before`` and ``after``,
    with their new value (``None``: removed)."""
    return {
        name: after.get(name)
        for name in names
        if _canonical(before.get(name, _ABSENT)) != _canonical(after.get(name, _ABSENT))
    }


_ABSENT = object()


def _canonical(value: Any) -> str:
    """Equality as JSON sees it (``1`` is not ``true``, nor ``1.0``)."""
    return "\0absent" if value is _ABSENT else json.dumps(value, sort_keys=True)


def _wire(changes: Mapping[str, Change]) -> dict[str, Any]:
    return {name: change.as_wire() for name, change in changes.items()}


def _v(snapshot: Snapshot | None) -> str:
    if snapshot is None:
        return "unknown"
    return "absent" if snapshot.version is None else repr(snapshot.version)

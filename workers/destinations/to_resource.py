"""A destination that holds the records: the event's change is written where the record
lives, with the write discipline of :mod:`keylane.workers.resource` (fresh read, owned
fields only, write only if still the version read, bounded re-reads, else a review row).

A source names it with ``records_in``. Its events are changes, exactly as for keylane's own
records; keylane's store keeps the journal (one outcome per event id) and the review rows.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ...routing.contract.destinations import DestinationConfig
from ...routing.contract.errors import ResourceUnavailable
from ...routing.contract.events import Event
from ...routing.contract.sources import ALL_FIELDS, FieldOwnership, Sources
from ..conditions import REFUSED_BY_CONDITION
from ..resource import (
    Refused,
    Review,
    Snapshot,
    VersionedResource,
    WriteNote,
    Written,
    apply_versioned,
    revision_of,
)
from ..resources import open_resource
from . import Context, Destination, Done, GiveUp, Outcome, Refuse, RetryLater

#: How much of a review's two bodies is kept in the dead letter's error text.
DETAIL_CHARS = 8000


class ResourceDestination(Destination):
    """Applies each event's change to the record where it lives (one resource connection
    per lane thread: a resource holds one connection)."""

    give_up_reason = "conflict"

    def __init__(
        self,
        config: DestinationConfig,
        sources: Sources,
        max_attempts: int,
        environ: Mapping[str, str],
    ) -> None:
        super().__init__(config)
        assert config.resource is not None
        self.sources = sources
        self.max_attempts = max_attempts
        self._environ = dict(environ)
        self._local = threading.local()
        self._opened: list[VersionedResource] = []
        self._lock = threading.Lock()
        self._resource().close()  # refuse at start-up what cannot work (ConfigError)
        self._local.resource = None
        with self._lock:
            self._opened.clear()

    def call_blocking(self, event: Event, context: Context) -> Outcome:
        """Apply the event's change, version-checked, once."""
        source = self.sources.get(event.source)
        if source is None:
            return GiveUp(f"source {event.source!r} is not configured", reason="unknown_source")
        if not event.changes:
            return GiveUp("the event carries no change to write", reason="no_change")
        try:
            result = apply_versioned(
                self._resource(),
                event.record_key,
                event.changes,
                source.ownership,
                source.name,
                self.max_attempts,
                _in_doubt(context.write_in_doubt),
                _noting(context.note_write),
                (event.conditions, event.if_revision) if event.conditional else None,
            )
        except ResourceUnavailable as exc:
            retry_after = exc.retry_after_s
            return RetryLater(
                str(exc), delay_s=retry_after, pause_destination=retry_after is not None
            )
        if isinstance(result, Written):
            verb = "created" if result.created else "wrote" if result.changed else "unchanged"
            detail = f"{verb} version {result.version} after {result.attempts} attempt(s)"
            return Done(detail, result={"version": result.version, "fields": result.fields})
        if isinstance(result, Refused):
            refuse = Refuse(REFUSED_BY_CONDITION)
            refuse.result = result.result()
            return refuse
        return _review(result)

    def describe(self, event: Event, context: Context) -> dict[str, Any]:
        """Where the change went and what it was."""
        return {
            "resource": self.config.kind,
            "record_key": event.record_key,
            "change": event.changes_wire(),
            "idempotency_key": context.idempotency_key,
        }

    def close(self) -> None:
        """Close every lane's connection."""
        with self._lock:
            opened, self._opened = self._opened, []
        for resource in opened:
            resource.close()

    def _resource(self) -> VersionedResource:
        resource: VersionedResource | None = getattr(self._local, "resource", None)
        if resource is None:
            assert self.config.resource is not None
            resource = open_resource(self.config.resource, self._environ, self._owned())
            self._local.resource = resource
            with self._lock:
                self._opened.append(resource)
        return resource

    def _owned(self) -> FieldOwnership:
        """The fields keylane writes there: what a resource without versions compares."""
        names: set[str] = set()
        for source in self.sources.all():
            if source.records_in == self.config.name:
                if source.ownership.everything:
                    return ALL_FIELDS
                names |= source.ownership.fields
        return FieldOwnership.of(sorted(names)) if names else ALL_FIELDS


def _in_doubt(condition: str | None) -> Snapshot | None:
    """The read an earlier run's unanswered write was conditional on (its version)."""
    return None if condition is None else Snapshot({}, json.loads(condition))


def _noting(note: Callable[[str | None], None] | None) -> WriteNote | None:
    """Keep each write's condition (the version read) with the message, as JSON."""
    if note is None:
        return None
    return lambda read: note(None if read is None else json.dumps(read.version))


def _review(review: Review) -> GiveUp:
    """A review row: the change, the versions read and found, both bodies."""
    detail = json.dumps(review.detail(), default=str, sort_keys=True)[:DETAIL_CHARS]
    return GiveUp(
        f"{review.error}\n{detail}",
        reason=review.reason,
        revision_read=revision_of(review.version_read),
        revision_found=revision_of(review.version_found),
    )

"""HTTP resources without versions (Notion, Airtable, Google Sheets): compare, then write.

Such an API has no conditional write, so the version is made up from what the record
shows: its last-edited stamp (``stamp_at``) or, without one, a digest of the compared
fields' values (the source's owned fields). Right before each write the record is read
again and the write goes only if that version is still the one the change was computed
from; the write then sends only the changed fields.

**This narrows the window, it does not close it.** An edit that lands between that
last read and the write (one round trip) is not seen, and the write can overwrite it,
for the fields the write sends. keylane closes the window against its own writers only:
one lane per record key means no two keylane writes to a record ever overlap. Fields
the source does not own are never sent, so only an outside edit of an owned field can
be lost. A stamp coarser than the edits (Notion's ``last_edited_time`` is rounded to the
minute) misses more; leave ``stamp_at`` out to compare the values instead.

A record is created with ``PUT`` to its URL, after a read that finds it absent; an API that
creates records only with ``POST`` to a collection refuses that, and the event is reviewed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ...routing.contract.errors import ResourceRefused, WriteConflict
from ...routing.contract.resources import StampedResourceConfig
from ...routing.contract.sources import ALL_FIELDS, FieldOwnership
from ..resource import Snapshot, Version
from .http import HttpRecords


class StampedResource:
    """A :class:`~keylane.workers.resource.VersionedResource` over an HTTP API that has
    no versions (see the module docstring for what that costs)."""

    def __init__(
        self,
        config: StampedResourceConfig,
        environ: Mapping[str, str],
        compare: FieldOwnership = ALL_FIELDS,
    ) -> None:
        self.config = config
        self.compare = compare
        self.http = HttpRecords(config, environ)

    def read(self, key: str) -> Snapshot:
        """``GET`` the record; its version is its stamp or its compared fields' digest."""
        return self.http.read(
            key, lambda answer, fields: self._version(key, answer.document, fields)
        )

    def create(self, key: str, fields: Mapping[str, Any]) -> Version | None:
        """``PUT`` the fields to the record's URL if it is still absent when read again."""
        if self.read(key).exists:
            raise WriteConflict(f"{key}: created by someone else since it was read")
        return self._send(key, fields, creating=True)

    def update(self, key: str, fields: Mapping[str, Any], read: Snapshot) -> Version | None:
        """Send the changed fields if the record's version is still ``read.version``."""
        now = self.read(key)
        if now.version != read.version:
            raise WriteConflict(f"{key}: {read.version!r} is now {now.version!r}")
        return self._send(key, fields, creating=False)

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def _send(self, key: str, fields: Mapping[str, Any], creating: bool) -> Version | None:
        method = "PUT" if creating else self.config.write.upper()
        answer = self.http.send(method, key, self.http.wrapped(fields), {}, creating)
        if not isinstance(answer.document, dict):
            return None
        return self._version(key, answer.document, self.http.fields_of(answer.document))

    def _version(self, key: str, document: Any, fields: Mapping[str, Any]) -> str:
        if self.config.stamp_at is None:
            return fields_digest(fields, self.compare)
        stamp = document
        for part in self.config.stamp_at.split("."):
            stamp = stamp.get(part) if isinstance(stamp, dict) else None
        if stamp is None:
            raise ResourceRefused(f"{key}: the record has no stamp at {self.config.stamp_at}")
        return str(stamp)


def fields_digest(fields: Mapping[str, Any], compare: FieldOwnership) -> str:
    """A digest of the values of the compared fields (absent ones included as absent)."""
    kept = {n: v for n, v in fields.items() if not compare.not_owned([n])}
    canonical = json.dumps(kept, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:32]

"""``keylane records``: read a record, or edit it from outside the lanes.

An outside edit is what a person in the CRM does: it reads the record, changes fields,
and writes with the revision it read; the store advances the revision. A lane that read
the record before the edit then fails its conditional write and re-applies its change
on a fresh read, so neither side's change is lost.
"""

from __future__ import annotations

import json
from typing import Any

from ..routing.contract.errors import KeylaneError, RecordMerged, VersionConflict
from ..workers.store import RecordStore
from ..workers.store_rows import Record

MAX_EDIT_ATTEMPTS = 20


def parse_assignment(text: str) -> tuple[str, Any]:
    """``FIELD=VALUE``: VALUE is read as JSON when it is JSON (``42``, ``true``,
    ``["a"]``, ``"quoted"``), otherwise as text."""
    field, sep, raw = text.partition("=")
    if not sep or not field:
        raise KeylaneError(f"expected FIELD=VALUE, got {text!r}")
    try:
        value = json.loads(raw, parse_constant=_not_json)
    except ValueError:
        return field, raw
    return field, value


def _not_json(name: str) -> Any:
    """``NaN``, ``Infinity``: Python's json reads them, JSON has no such value."""
    raise KeylaneError(f"{name} is not a JSON value (quote it for the text {name!r})")


def edit_record(
    store: RecordStore,
    record_key: str,
    assign: dict[str, Any],
    unset: list[str] = (),  # type: ignore[assignment]
) -> Record:
    """Set and unset fields with a revision-checked write, re-reading on conflict."""
    for _ in range(MAX_EDIT_ATTEMPTS):
        record = store.read(record_key)
        fields = {k: v for k, v in record.fields.items() if k not in unset}
        fields.update(assign)
        try:
            revision = store.write_outside(record_key, fields, record.revision)
        except RecordMerged as exc:
            raise KeylaneError(
                f"record {record_key!r} was merged into {exc.survivor!r}: edit that record"
            ) from None
        except VersionConflict:
            continue
        return Record(record_key, fields, revision)
    raise KeylaneError(
        f"record {record_key!r} kept changing; gave up after {MAX_EDIT_ATTEMPTS} tries"
    )


def record_json(record: Record, identities: list[str] | None = None) -> dict[str, Any]:
    """A record as ``records get --json`` prints it: with ``merged_into`` (the record that
    absorbed it, and since when: ``updated_at``) and its identities when given."""
    shown: dict[str, Any] = {
        "key": record.key,
        "exists": record.exists,
        "revision": record.revision,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "merged_into": record.merged_into,
        "fields": record.fields,
    }
    if identities is not None:
        shown["identities"] = identities
    return shown

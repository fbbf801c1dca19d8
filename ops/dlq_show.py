"""``keylane dlq show``: one review row, shown for the kind of dead letter it is
(:func:`keylane.ops.triage.kind_of`):

* a change to keylane's own records: the revisions, and field by field the attempted
  change beside the record as it is now and what applying it now would give;
* a change to a record that lives elsewhere (a source's ``records_in``): the same, beside
  a fresh read of the record where it lives, or why it cannot be read from here;
* an event a task or an HTTP forward was given: the payload, the answer that came back,
  the attempts (there is no change and no revision to show).
"""

from __future__ import annotations

import json
from typing import Any

from ..workers.store_rows import MERGE_REVIEW, DeadLetter
from .cli_common import when
from .merge_review import MergeSides, merge_lines
from .tables import render_table
from .triage import FieldDiff, RecordNow, kind_of

#: Payload lines shown as text (all of it with --json).
PAYLOAD_LINES = 40


def show_json(
    row: dict[str, Any], dead: DeadLetter, record: RecordNow | None, diffs: list[FieldDiff]
) -> dict[str, Any]:
    """``dlq show --json``: the row (``row``, as ``dlq list --json`` prints it), its kind,
    the record as it is now (None for a delivery) and the field-by-field diff."""
    now = None
    if record is not None:
        now = {"where": record.where, "revision": record.version, "fields": record.fields}
        if record.error is not None:
            now["error"] = record.error
    return {
        **row,
        "kind": kind_of(dead),
        "record_now": now,
        "fields": [
            {
                "field": d.field,
                "change": d.change,
                "now": d.now,
                "would_be": d.would_be,
                "differs": d.differs,
            }
            for d in diffs
        ],
    }


def show_text(row: DeadLetter, record: RecordNow | None, diffs: list[FieldDiff]) -> list[str]:
    """The lines of ``dlq show``."""
    kind = kind_of(row)
    lines = [
        f"dead letter {row.id}  [{row.status}]  reason: {row.reason}",
        f"  event       {row.source}/{row.event_id}  ({row.event.get('event_type', '?')})",
        f"  record      {row.record_key}  (shard {row.shard})",
    ]
    error_lines, versions = _split_error(row.error)
    if kind == "delivery":
        lines.append(f"  sent to     {row.event.get('destination')}")
    else:
        assert record is not None
        lines.append(_revisions(row, record, versions))
    lines.append(f"  attempts    {row.attempts}   created {when(row.created_at)} UTC")
    lines += _block("error", error_lines)
    if row.status != "open":
        lines.append(
            f"  {row.status:<11} by {row.status_by} at {when(row.status_at)}"
            + (f": {row.note}" if row.note else "")
        )
    if kind == "delivery":
        return [*lines, "", "payload:", *_payload(row.event.get("payload"))]
    if row.reason == MERGE_REVIEW:
        return [*lines, "", *merge_lines(MergeSides.of(row))]
    assert record is not None
    if record.error is not None:
        lines += ["", record.error]
    return [*lines, "", _diff_table(diffs, record)]


def _revisions(row: DeadLetter, record: RecordNow, versions: dict[str, Any] | None) -> str:
    """Read, found and now: keylane's revisions, or the versions where the record lives."""
    if record.where == "keylane":
        revisions = f"read {row.revision_read}, found {row.revision_found}"
        return f"  revisions   {revisions}, now {record.version}"
    if versions is None:  # no review of the record (e.g. it could not be reached)
        read = found = "-"
    else:
        read = _version(versions.get("version_read"))
        found = _version(versions.get("version_found"))
    now = "unknown" if record.error is not None else _version(record.version)
    versions_now = f"read {read}, found {found}, now {now}"
    return f"  versions    {versions_now} (in {record.where})"


def _version(version: Any) -> str:
    return "absent" if version is None else json.dumps(version)


def _split_error(error: str) -> tuple[list[str], dict[str, Any] | None]:
    """The error's lines, without the versions and bodies a version-checked destination
    appends as JSON (kept whole in ``--json``); those, parsed."""
    lines = error.splitlines() or [""]
    try:
        detail = json.loads(lines[-1])
    except ValueError:
        return lines, None
    if isinstance(detail, dict) and "version_read" in detail:
        return lines[:-1] or [""], detail
    return lines, None


def _block(label: str, lines: list[str]) -> list[str]:
    first, *rest = lines
    return [f"  {label:<11} {first}", *(f"  {'':<11} {line}" for line in rest)]


def _payload(payload: Any) -> list[str]:
    text = json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False).splitlines()
    if len(text) <= PAYLOAD_LINES:
        return [f"  {line}" for line in text]
    cut = [f"  {line}" for line in text[:PAYLOAD_LINES]]
    return [*cut, f"  ... ({len(text) - PAYLOAD_LINES} more lines: dlq show --json)"]


def _diff_table(diffs: list[FieldDiff], record: RecordNow) -> str:
    unknown = record.error is not None
    return render_table(
        ["", "field", "attempted change", "now", "would be"],
        [
            [
                "*" if d.differs and not unknown else "",
                d.field,
                json.dumps(d.change),
                "(unknown)" if unknown else _value(d.now),
                "(unknown)" if unknown else _value(d.would_be),
            ]
            for d in diffs
        ],
    )


def _value(value: Any) -> str:
    return value if isinstance(value, str) and value.startswith("(") else json.dumps(value)

"""ops/dlq_show.py: ``keylane dlq show``, one review row shown for the kind it is."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from keylane.ops.dlq_show import PAYLOAD_LINES, show_json, show_text
from keylane.ops.triage import FieldDiff, RecordNow
from keylane.workers.store_rows import DeadLetter

CREATED = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


def row(**changes: Any) -> DeadLetter:
    """A conflict on keylane's own record ``contact:1``."""
    base = DeadLetter(
        source="crm",
        event_id="e1",
        record_key="contact:1",
        shard=2,
        reason="conflict",
        event={"event_type": "contact.updated", "changes": {"name": {"set": "Zoë"}}},
        attempted_change={"name": {"set": "Zoë"}, "visits": {"increment": 1}},
        revision_read=3,
        revision_found=4,
        attempts=5,
        error="the record moved on every attempt",
        id=17,
        created_at=CREATED,
    )
    return replace(base, **changes)


DIFFS = [
    FieldDiff("name", {"set": "Zoë"}, "Zoe", "Zoë", True),
    FieldDiff("visits", {"increment": 1}, "(absent)", 1, False),
]


def test_a_change_to_keylanes_record_shows_its_revisions_and_a_field_by_field_diff() -> None:
    lines = show_text(row(), RecordNow("keylane", 5, {"name": "Zoe"}), DIFFS)
    assert lines[:6] == [
        "dead letter 17  [open]  reason: conflict",
        "  event       crm/e1  (contact.updated)",
        "  record      contact:1  (shard 2)",
        "  revisions   read 3, found 4, now 5",
        "  attempts    5   created 2023-11-14 22:13:20 UTC",
        "  error       the record moved on every attempt",
    ]
    assert lines[6] == ""
    header, name, visits = lines[7].splitlines()
    assert header.split() == ["FIELD", "ATTEMPTED", "CHANGE", "NOW", "WOULD", "BE"]
    # The field that differs is starred; a note in parentheses is shown as it is
    assert name.split() == ["*", "name", '{"set":', '"Zo\\u00eb"}', '"Zoe"', '"Zo\\u00eb"']
    assert visits.split() == ["visits", '{"increment":', "1}", "(absent)", "1"]


def test_a_closed_row_says_who_closed_it_when_and_why() -> None:
    closed = row(status="resolved", status_by="ana", status_at=CREATED + 60, note="fixed by hand")
    lines = show_text(closed, RecordNow("keylane", 5, {}), [])
    assert "  resolved    by ana at 2023-11-14 22:14:20: fixed by hand" in lines


def test_a_record_elsewhere_shows_the_versions_the_destination_appended_to_the_error() -> None:
    detail = {"version_read": "etag-1", "version_found": "etag-2", "body": "..."}
    elsewhere = row(
        event={"event_type": "t", "destination": "notion"},
        error="412 Precondition Failed\nthe page moved\n" + json.dumps(detail),
    )
    lines = show_text(elsewhere, RecordNow("notion", "etag-3", {}), [])
    assert '  versions    read "etag-1", found "etag-2", now "etag-3" (in notion)' in lines
    # The JSON line is not part of the error shown (--json keeps it)
    assert lines[5:7] == ["  error       412 Precondition Failed", "              the page moved"]
    assert not any("version_read" in line for line in lines)


def test_a_record_elsewhere_that_cannot_be_read_shows_why_and_no_values() -> None:
    elsewhere = row(event={"event_type": "t", "destination": "notion"}, error="timed out")
    unknown = RecordNow(
        "notion", None, {}, error="destination notion is not in this command's sources"
    )
    lines = show_text(elsewhere, unknown, DIFFS)
    assert "  versions    read -, found -, now unknown (in notion)" in lines
    assert "destination notion is not in this command's sources" in lines
    table = lines[-1].splitlines()
    assert table[1].split()[-2:] == ["(unknown)", "(unknown)"]
    assert not table[1].startswith("*")  # nothing is known to differ


def test_a_delivery_shows_where_it_was_sent_and_its_payload() -> None:
    payload = {"email": "a@b.c", "n": 1}
    delivery = row(
        event={"event_type": "t", "destination": "welcome", "payload": payload},
        attempted_change={},
    )
    lines = show_text(delivery, None, [])
    assert "  sent to     welcome" in lines
    assert not any(line.startswith("  revisions") for line in lines)
    assert lines[lines.index("payload:") + 1 :] == [
        "  {",
        '    "email": "a@b.c",',
        '    "n": 1',
        "  }",
    ]


def test_a_long_payload_is_cut_and_says_how_to_see_all_of_it() -> None:
    payload = {f"k{n:03d}": n for n in range(100)}
    delivery = row(event={"destination": "welcome", "payload": payload}, attempted_change={})
    lines = show_text(delivery, None, [])
    shown = lines[lines.index("payload:") + 1 :]
    assert len(shown) == PAYLOAD_LINES + 1
    assert shown[-1] == f"  ... ({102 - PAYLOAD_LINES} more lines: dlq show --json)"


def test_json_adds_the_kind_the_record_now_and_each_fields_diff() -> None:
    listed = {"id": 17, "status": "open"}
    doc = show_json(listed, row(), RecordNow("keylane", 5, {"name": "Zoe"}), DIFFS[:1])
    assert doc == {
        "id": 17,
        "status": "open",
        "kind": "records",
        "record_now": {"where": "keylane", "revision": 5, "fields": {"name": "Zoe"}},
        "fields": [
            {
                "field": "name",
                "change": {"set": "Zoë"},
                "now": "Zoe",
                "would_be": "Zoë",
                "differs": True,
            }
        ],
    }
    delivery = row(event={"destination": "welcome"}, attempted_change={})
    unread = RecordNow("notion", None, {}, error="unreachable")
    assert show_json({}, delivery, None, [])["record_now"] is None
    assert show_json({}, delivery, None, [])["kind"] == "delivery"
    assert show_json({}, row(event={"destination": "notion"}), unread, [])["record_now"] == {
        "where": "notion",
        "revision": None,
        "fields": {},
        "error": "unreachable",
    }

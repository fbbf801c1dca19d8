"""workers/dead_letters.py: how an event becomes a review row closed in the journal, and
the review rows of flagged events, malformed bytes and poison messages, against a real
SQLite store. (tests/test_dead_letters.py drives dead letters end to end.)"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from keylane.routing.contract.destinations import EXCERPT_CHARS
from keylane.routing.contract.message import build_event_message
from keylane.workers.dead_letters import (
    REVIEW_ERRORS,
    Failure,
    alert,
    dead_letter,
    dead_letters,
    malformed,
    open_dead_letter,
    past_delivery_limit,
    review,
)
from keylane.workers.lane_store import event_write
from keylane.workers.results import ApplyResult
from keylane.workers.store import DeadLetterStore
from keylane.workers.store_rows import DeadLetterFilter, Fence
from keylane.workers.stores import open_store
from keylane.workers.stores.sql import SqlStore
from tests.support.lane_parts import lane_event

FENCE = Fence(shard=2, token=1)
CONFLICTS = Failure("conflict", attempts=5, error="moved", revision_read=3, conflicts=4)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite3'}")
    store.migrate()
    yield store
    store.close()


def rows(store: DeadLetterStore, event_id: str | None = None) -> list[tuple[str, str, str]]:
    found = store.dead_letters(DeadLetterFilter())
    return [(r.event_id, r.reason, r.error) for r in found if event_id in (None, r.event_id)]


def test_a_dead_letter_keeps_the_event_its_change_and_revisions_and_closes_it(
    store: SqlStore,
) -> None:
    event = lane_event("e1", "contact:1", name={"set": "Zoë"})
    result = dead_letter(store, event, FENCE, CONFLICTS)
    assert result == ApplyResult(
        "dead_lettered",
        attempts=5,
        conflicts=4,
        dead_letter_id=result.dead_letter_id,
        reason="conflict",
    )
    row = store.dead_letter(result.dead_letter_id or 0)
    assert row is not None
    assert (row.source, row.event_id, row.record_key, row.shard) == ("crm", "e1", "contact:1", 2)
    assert row.attempted_change == {"name": {"set": "Zoë"}}
    assert row.event == event.model_dump(mode="json")
    # No revision found: the one read
    assert (row.revision_read, row.revision_found, row.attempts) == (3, 3, 5)
    entry = store.journal("crm", "e1")
    assert entry is not None
    assert entry.outcome == "dead_lettered"


def test_the_revision_found_is_kept_when_it_differs(store: DeadLetterStore) -> None:
    failure = Failure("conflict", 2, "moved", revision_read=3, revision_found=6)
    result = dead_letter(store, lane_event("e1", "contact:1"), FENCE, failure)
    row = store.dead_letter(result.dead_letter_id or 0)
    assert row is not None
    assert (row.revision_read, row.revision_found) == (3, 6)


def test_an_event_already_applied_is_a_duplicate_and_no_row(store: SqlStore) -> None:
    event = lane_event("e1", "contact:1")
    store.commit_event(event_write(event, {"n": 1}, 0, 1), FENCE)
    assert dead_letter(store, event, FENCE, CONFLICTS) == ApplyResult(
        "duplicate", attempts=5, conflicts=4
    )
    assert rows(store) == []


def test_a_batch_gives_each_event_its_row(store: DeadLetterStore) -> None:
    events = [lane_event(f"e{n}", "contact:1") for n in range(3)]
    results = dead_letters(store, events, FENCE, Failure("gave_up", 3, "HTTP 500"))
    assert [r.outcome for r in results] == ["dead_lettered"] * 3
    assert len({r.dead_letter_id for r in results}) == 3
    assert sorted(rows(store)) == [(f"e{n}", "gave_up", "HTTP 500") for n in range(3)]


def test_a_reused_id_is_reviewed_with_its_explanation_and_the_journal_left_alone(
    store: SqlStore,
) -> None:
    event = lane_event("e1", "contact:1").model_copy(update={"review": "id_reused"})
    result = review(store, event, FENCE)
    assert (result.outcome, result.reason, result.attempts) == ("dead_lettered", "id_reused", 1)
    assert rows(store) == [("e1", "id_reused", REVIEW_ERRORS["id_reused"])]
    # The first body of e1 may still apply: its journal entry is not taken
    assert store.journal("crm", "e1") is None


def test_a_review_without_an_explanation_shows_its_reason_as_the_error(
    store: DeadLetterStore,
) -> None:
    event = lane_event("e1", "contact:1").model_copy(update={"review": "too_big"})
    review(store, event, FENCE)
    assert rows(store) == [("e1", "too_big", "too_big")]


def test_malformed_bytes_are_a_row_named_by_their_digest_with_text_and_error_cut(
    store: DeadLetterStore,
) -> None:
    raw = b"\xff" + b"x" * 5000
    row_id = malformed(store, 4, raw, "E" * (EXCERPT_CHARS + 10), FENCE)
    row = store.dead_letter(row_id)
    assert row is not None
    assert (row.source, row.record_key, row.shard, row.reason) == ("", "", 4, "malformed")
    assert row.event_id == "sha256:" + hashlib.sha256(raw).hexdigest()
    assert row.event == {"raw": "\ufffd" + "x" * 4095}
    assert row.error == "E" * EXCERPT_CHARS


def test_malformed_bytes_delivered_twice_make_one_row(store: DeadLetterStore) -> None:
    first = malformed(store, 4, b"not a message", "bad", FENCE)
    second = malformed(store, 4, b"not a message", "bad", FENCE)
    assert len(rows(store)) == 1
    assert second == first


def test_the_open_row_of_a_dead_lettered_event_is_found_again(store: SqlStore) -> None:
    event = lane_event("e1", "contact:1")
    other = lane_event("e2", "contact:1")
    assert open_dead_letter(store, store, event) is None  # not journaled
    result = dead_letter(store, event, FENCE, CONFLICTS)
    dead_letter(store, other, FENCE, CONFLICTS)
    assert open_dead_letter(store, store, event) == result.dead_letter_id
    # Once the row is closed there is no open one to find
    store.set_dead_letter_status(result.dead_letter_id or 0, "resolved", ("open",), "ana", "fixed")
    assert open_dead_letter(store, store, event) is None


def test_an_applied_event_has_no_open_dead_letter(store: SqlStore) -> None:
    event = lane_event("e1", "contact:1")
    store.commit_event(event_write(event, {"n": 1}, 0, 1), FENCE)
    assert open_dead_letter(store, store, event) is None


def test_a_message_past_its_delivery_limit_is_a_poison_row(store: SqlStore) -> None:
    event = lane_event("e1", "contact:1")
    result = past_delivery_limit(store, build_event_message(event, "keylane.shard.2"), 4)
    assert isinstance(result, ApplyResult)
    assert (result.outcome, result.reason, result.attempts) == ("dead_lettered", "poison", 4)
    assert rows(store) == [
        ("e1", "poison", "handed out 4 times and never finished (the worker died each time)")
    ]
    entry = store.journal("crm", "e1")
    assert entry is not None
    assert entry.outcome == "dead_lettered"


def test_bytes_past_their_delivery_limit_that_are_no_event_are_a_malformed_row(
    store: DeadLetterStore,
) -> None:
    row_id = past_delivery_limit(store, b"garbage", 4)
    assert isinstance(row_id, int)
    row = store.dead_letter(row_id)
    assert row is not None
    assert (row.reason, row.shard, row.event) == (
        "malformed",
        -1,
        {"raw": "garbage"},
    )


def test_an_alert_names_the_event_and_reason_but_none_of_its_values(
    caplog: pytest.LogCaptureFixture,
) -> None:
    event = lane_event("e1", "contact:1", email={"set": "secret@example.com"})
    result = ApplyResult("dead_lettered", attempts=1, dead_letter_id=9, reason="gave_up")
    with caplog.at_level(logging.WARNING, logger="keylane.alerts"):
        alert(event, result)
    (record,) = caplog.records
    assert record.getMessage() == "dead letter 9: crm/e1 on contact:1 (shard 2): gave_up"
    assert "secret@example.com" not in caplog.text

"""Conditions on a record: the wire form's rules (routing/contract/conditions.py), the check
on a fresh read (workers/conditions.py), a refusal written under the revision it was
decided on (both stores), and the receiver's 400 for a malformed condition."""

from __future__ import annotations

from typing import Any

import pytest

from keylane.routing.contract.conditions import check_conditions as parse_conditions
from keylane.routing.contract.errors import VersionConflict
from keylane.routing.contract.events import Envelope
from keylane.routing.contract.sources import parse_sources
from keylane.workers.conditions import check_conditions, same
from keylane.workers.store_rows import EventWrite
from keylane.workers.stores.sql import SqlStore
from tests.support.stack import Stack


def _unmet(conditions: dict[str, Any], fields: dict[str, Any], if_revision: int | None = None):
    return check_conditions(parse_conditions(conditions), if_revision, fields, 4)


@pytest.mark.parametrize(
    ("conditions", "fields"),
    [
        ({"owner": {"absent": True}}, {}),
        ({"owner": {"present": True}}, {"owner": None}),
        ({"stock": {"gte": 1}}, {"stock": 1}),
        ({"stock": {"gt": 0, "lte": 5}}, {"stock": 5.0}),
        ({"stock": {"lt": 0.5}}, {"stock": 0}),
        ({"plan": {"eq": "pro"}}, {"plan": "pro"}),
        ({"n": {"eq": 1}}, {"n": 1.0}),
        ({"plan": {"ne": "pro"}}, {}),
        ({"plan": {"in": ["pro", "team"]}}, {"plan": "team"}),
        ({"tags": {"eq": ["a", {"b": 1}]}}, {"tags": ["a", {"b": 1}]}),
    ],
)
def test_a_condition_that_holds_lets_the_change_apply(
    conditions: dict[str, Any], fields: dict[str, Any]
) -> None:
    # Given a record and conditions that hold on it / Then no condition is unmet
    assert _unmet(conditions, fields) is None


@pytest.mark.parametrize(
    ("conditions", "fields", "seen", "why"),
    [
        ({"owner": {"absent": True}}, {"owner": "ada"}, "ada", "owner is present ('ada')"),
        ({"owner": {"present": True}}, {}, None, "owner is absent"),
        ({"stock": {"gte": 1}}, {"stock": 0}, 0, "stock is 0, not >= 1"),
        ({"stock": {"gte": 1}}, {}, None, "stock is absent, not a number"),
        ({"stock": {"gte": 1}}, {"stock": "ten"}, "ten", "stock is text, not a number"),
        ({"stock": {"gte": 1}}, {"stock": True}, True, "stock is a boolean, not a number"),
        ({"n": {"eq": 1}}, {"n": True}, True, "n is True"),
        ({"plan": {"ne": "pro"}}, {"plan": "pro"}, "pro", "n"),
        ({"plan": {"in": ["pro"]}}, {"plan": "free"}, "free", "not one of"),
    ],
)
def test_an_unmet_condition_says_which_field_what_was_seen_and_why(
    conditions: dict[str, Any], fields: dict[str, Any], seen: Any, why: str
) -> None:
    # Given a record on which the condition does not hold
    unmet = _unmet(conditions, fields)
    # Then the refusal names the condition as sent, the field, the value seen, the revision
    assert unmet is not None
    field = next(iter(conditions))
    assert unmet.as_result()["condition"] == {field: conditions[field]}
    assert (unmet.field, unmet.seen, unmet.revision) == (field, seen, 4)
    assert why in unmet.why


def test_if_revision_holds_only_at_the_revision_the_sender_read() -> None:
    # Given a record at revision 4
    # Then if_revision 4 holds, and 3 is refused with the revision seen
    assert check_conditions(None, 4, {}, 4) is None
    unmet = check_conditions(None, 3, {}, 4)
    assert unmet is not None
    assert unmet.as_result() == {
        "reason": "condition_unmet",
        "condition": {"if_revision": 3},
        "field": None,
        "seen": 4,
        "revision": 4,
        "why": "the record is at revision 4, not 3",
    }


def test_json_equality_tells_numbers_from_booleans() -> None:
    assert same(1, 1.0)
    assert not same(1, True)
    assert not same([1], [True])
    assert same({"a": [1, 2]}, {"a": [1.0, 2]})
    assert not same({"a": 1}, {"b": 1})


@pytest.mark.parametrize(
    ("conditions", "named"),
    [
        ({"stock": {"atleast": 1}}, "unknown condition operator 'atleast'"),
        ({"stock": {"gte": "1"}}, "field 'stock': gte needs a finite number"),
        ({"stock": {"gte": True}}, "gte needs a finite number"),
        ({"tags": {"in": []}}, "field 'tags': in needs a non-empty list"),
        ({"tags": {"in": "vip"}}, "in needs a non-empty list"),
        ({"owner": {"absent": False}}, "absent takes true"),
        ({"owner": {"absent": True, "eq": 1}}, "absent cannot be combined"),
        ({"owner": {}}, "a condition is an object of operators"),
        ({"owner": 1}, "a condition is an object of operators"),
        ({}, "conditions must be a non-empty object"),
    ],
)
def test_a_malformed_condition_is_refused_naming_it(conditions: dict[str, Any], named: str) -> None:
    # Given an envelope whose conditions are malformed / Then reading it names the problem
    body = {"record_key": "a", "changes": {"x": {"set": 1}}, "conditions": conditions}
    with pytest.raises(ValueError, match="conditions: ") as caught:
        Envelope.read(body)
    assert named in str(caught.value)


def test_if_revision_must_be_a_whole_number() -> None:
    for bad in (-1, 1.5, "7", True):
        with pytest.raises(ValueError, match="if_revision must be an integer"):
            Envelope.read({"record_key": "a", "changes": {"x": {"set": 1}}, "if_revision": bad})


def test_a_source_maps_conditions_per_event_type_and_checks_literals_at_start_up() -> None:
    # Given a sources file with a conditions table
    text = """
[sources.shop]
format = "mapped"
record_key = "item:{body:sku}"
[sources.shop.on."order.created"]
stock = { increment = -1 }
[sources.shop.conditions."order.created"]
stock = { gte = "body:min" }
"""
    # Then it loads; a bound that is a non-number literal does not
    assert parse_sources(text).get("shop") is not None
    bad = text.replace('gte = "body:min"', 'gte = "one"')
    with pytest.raises(Exception, match="gte needs a finite number"):
        parse_sources(bad)


def _write(key: str, expected: int, **kw: Any) -> EventWrite:
    return EventWrite("demo", kw.pop("event_id", "e1"), key, 0, None, expected, 1, **kw)


def test_a_refusal_is_written_only_while_the_record_is_at_the_revision_it_was_decided_on(
    store: SqlStore,
) -> None:
    # Given a record at revision 1, and a refusal decided on revision 1
    store.commit_event(EventWrite("demo", "e0", "slot:1", 0, {"owner": "ada"}, 0, 1), None)
    result = {"condition": {"owner": {"absent": True}}, "field": "owner", "seen": "ada"}
    refusal = _write("slot:1", 1, outcome="refused", result=result, decided_on_read=True)
    # When someone writes the record first
    store.write_outside("slot:1", {"owner": "bob"}, 1)
    # Then the refusal is refused as a stale write would be, and nothing is journaled
    with pytest.raises(VersionConflict):
        store.commit_event(refusal, None)
    assert store.journal("demo", "e1") is None
    # And written at the revision now there, it is journaled with its result
    store.commit_event(refusal.__class__(**{**refusal.__dict__, "expected_revision": 2}), None)
    entry = store.journal("demo", "e1")
    assert entry is not None
    assert (entry.outcome, entry.revision, entry.result) == ("refused", 2, result)


def test_an_applied_write_journals_its_revision_and_the_new_values(store: SqlStore) -> None:
    # Given a write carrying the new values of the fields it changed
    write = EventWrite("demo", "n1", "counter:1", 0, {"n": 1}, 0, 1, result={"fields": {"n": 1}})
    # When it commits / Then its journal entry carries the revision and the values
    assert store.commit_event(write, None) == 1
    entry = store.journal("demo", "n1")
    assert entry is not None
    assert entry.result == {"revision": 1, "fields": {"n": 1}}
    assert store.find_journal("n1")[0].result == entry.result


def test_migrate_adds_the_result_column_to_a_journal_made_before_it(tmp_path: Any) -> None:
    # Given a SQLite store whose journal was created without the result column
    import sqlite3

    from keylane.workers.stores import open_store

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE journal (source TEXT NOT NULL, event_id TEXT NOT NULL, record_key TEXT "
        "NOT NULL, shard INTEGER NOT NULL, outcome TEXT NOT NULL, revision INTEGER, attempts "
        "INTEGER NOT NULL, recorded_at REAL NOT NULL, fence INTEGER, "
        "PRIMARY KEY (source, event_id))"
    )
    conn.execute("INSERT INTO journal VALUES ('demo', 'old', 'k', 0, 'applied', 1, 1, 1.0, 1)")
    conn.commit()
    conn.close()
    # When migrate() runs (twice: it is idempotent)
    store = open_store(f"sqlite:///{path}")
    store.migrate()
    store.migrate()
    # Then the old row reads back without a result, and a new one keeps its result
    old = store.journal("demo", "old")
    assert old is not None
    assert old.result is None
    store.commit_event(_write("k", 0, event_id="new", result={"fields": {}}), None)
    new = store.journal("demo", "new")
    assert new is not None
    assert new.result == {"fields": {}}
    store.close()


@pytest.mark.slow
def test_the_receiver_answers_400_naming_a_malformed_condition_and_records_nothing(
    stack: Stack,
) -> None:
    # Given a receiver
    stack.receiver()
    body = {"id": "c1", "record_key": "item:1", "changes": {"stock": {"increment": -1}}}
    # When conditions are malformed / Then 400 invalid, naming the field and operator
    for conditions, named in [
        ({"stock": {"atleast": 1}}, "unknown condition operator 'atleast'"),
        ({"stock": {"gte": "one"}}, "gte needs a finite number"),
        ({"tags": {"in": []}}, "in needs a non-empty list"),
    ]:
        answer = stack.post({**body, "conditions": conditions})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"] == "invalid"
        assert named in answer.json()["detail"]
    # And the same id with a good condition is then accepted: the 400s left no mark
    answer = stack.post({**body, "conditions": {"stock": {"gte": 1}}})
    assert answer.status_code == 202, answer.text

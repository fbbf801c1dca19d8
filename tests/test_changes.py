"""workers/changes.py applies operations to a record's fields; workers/events.py reads
them from an envelope. Both are pure: these tests need no service."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keylane.routing.contract.errors import ChangeNotApplicable, FieldNotOwned, KeylaneError
from keylane.routing.contract.events import (
    MAX_FIELD_CHARS,
    MAX_FIELDS,
    MAX_ID_CHARS,
    MAX_KEY_CHARS,
    Change,
    Envelope,
    parse_changes,
)
from keylane.routing.contract.sources import ALL_FIELDS, FieldOwnership
from keylane.workers.changes import apply_changes

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=10)
json_values = st.recursive(
    json_scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


# Enough examples to find the edge cases of pure functions, few enough to stay quick.
quick = settings(max_examples=50)


def change(op: str, value: Any = None) -> Change:
    """A change as a sender would write it (``{"<op>": value}``)."""
    return Change.parse("f", {op: True if op == "unset" else value})


def apply(fields: dict[str, Any], **changes: Change) -> dict[str, Any]:
    return apply_changes(fields, changes)


# -- set / unset -------------------------------------------------------------------------


@quick
@given(before=json_values, value=json_values)
def test_set_replaces_the_value_whatever_was_there(before: Any, value: Any) -> None:
    # Given a field with any value, When it is set, Then it holds the new value
    assert apply({"f": before, "g": 1}, f=change("set", value)) == {"f": value, "g": 1}


def test_set_creates_an_absent_field_and_may_set_null() -> None:
    # Given a record without the field, When it is set (even to null), Then it exists
    assert apply({}, f=change("set", "a@b.c")) == {"f": "a@b.c"}
    assert apply({}, f=change("set", None)) == {"f": None}


def test_unset_removes_a_field_and_an_absent_field_stays_absent() -> None:
    # Given a record with and one without the field, When it is unset, Then it is gone
    assert apply({"f": 1, "g": 2}, f=change("unset")) == {"g": 2}
    assert apply({"g": 2}, f=change("unset")) == {"g": 2}


# -- increment ---------------------------------------------------------------------------


def test_increment_adds_to_ints_and_floats() -> None:
    # Given numeric fields, When they are incremented, Then the sums are exact
    assert apply({"f": 10}, f=change("increment", 5)) == {"f": 15}
    assert apply({"f": 10}, f=change("increment", -15)) == {"f": -5}
    assert apply({"f": 1.5}, f=change("increment", 2)) == {"f": 3.5}
    assert apply({"f": 2}, f=change("increment", 0.25)) == {"f": 2.25}
    assert apply({"f": 2**70}, f=change("increment", 1)) == {"f": 2**70 + 1}


def test_increment_of_an_absent_field_starts_from_zero() -> None:
    # Given no field, When it is incremented, Then it holds the increment
    assert apply({}, f=change("increment", 3)) == {"f": 3}
    assert apply({}, f=change("increment", -0.5)) == {"f": -0.5}


@pytest.mark.parametrize(
    ("current", "kind"),
    [
        (True, "a boolean"),
        (False, "a boolean"),
        ("10", "text"),
        ([1], "a list"),
        ({"n": 1}, "an object"),
    ],
)
def test_increment_of_a_non_number_is_not_applicable(current: Any, kind: str) -> None:
    # Given a field holding a boolean, text, a list or an object
    fields = {"f": current}
    # When it is incremented, Then the error names the field, the operation and the kind
    with pytest.raises(ChangeNotApplicable) as caught:
        apply(fields, f=change("increment", 1))
    assert str(caught.value) == f"increment on field 'f': current value is {kind}, not a number"
    assert caught.value.field == "f"
    assert caught.value.op == "increment"
    assert isinstance(caught.value, KeylaneError)


def test_increment_of_null_counts_as_absent() -> None:
    # Given a field explicitly set to null, When it is incremented, Then it starts at zero
    # (a stored null and an absent field read the same way)
    assert apply({"f": None}, f=change("increment", 2)) == {"f": 2}


@pytest.mark.parametrize(("current", "by"), [(1e308, 1e308), (-1e308, -1e308), (10**400, 0.5)])
def test_an_increment_without_a_finite_result_is_not_applicable(current: Any, by: Any) -> None:
    # Given a number so large that adding to it leaves the floats
    fields = {"f": current}
    # When it is incremented, Then the change does not apply (and says so), rather than
    # storing Infinity (not JSON; PostgreSQL refuses it) or failing with OverflowError
    with pytest.raises(ChangeNotApplicable, match="increment on field 'f'"):
        apply(fields, f=change("increment", by))


@quick
@given(
    start=st.integers(-(10**6), 10**6),
    steps=st.lists(st.integers(-(10**9), 10**9), max_size=30),
    data=st.data(),
)
def test_increments_in_any_order_give_the_same_sum(
    start: int, steps: list[int], data: st.DataObject
) -> None:
    # Given a counter and a list of increments, applied in two different orders
    shuffled = data.draw(st.permutations(steps))
    fields_a: dict[str, Any] = {"n": start}
    fields_b: dict[str, Any] = {"n": start}
    for step in steps:
        fields_a = apply(fields_a, n=change("increment", step))
    for step in shuffled:
        fields_b = apply(fields_b, n=change("increment", step))
    # Then both end at the exact sum
    assert fields_a == fields_b == {"n": start + sum(steps)}


@quick
@given(steps=st.lists(st.sampled_from([0.5, 0.25, -1.0, 2.0, 1e3]), max_size=30), data=st.data())
def test_float_increments_in_any_order_give_the_same_sum(
    steps: list[float], data: st.DataObject
) -> None:
    # Given increments that floats represent exactly (dyadic fractions), in two orders
    shuffled = data.draw(st.permutations(steps))
    fields_a: dict[str, Any] = {}
    fields_b: dict[str, Any] = {}
    for step in steps:
        fields_a = apply(fields_a, n=change("increment", step))
    for step in shuffled:
        fields_b = apply(fields_b, n=change("increment", step))
    # Then both sums are the same and exact
    assert fields_a.get("n", 0) == fields_b.get("n", 0) == math.fsum(steps)


# -- lists: append, add, remove ----------------------------------------------------------


def test_append_adds_to_the_end_even_when_present() -> None:
    # Given a list, When values are appended, Then they are at the end, repeats included
    assert apply({"f": [1, 2]}, f=change("append", 2)) == {"f": [1, 2, 2]}
    assert apply({}, f=change("append", {"a": 1})) == {"f": [{"a": 1}]}


def test_add_treats_the_list_as_a_set() -> None:
    # Given a list, When a value is added, Then it is appended only if not yet present
    assert apply({"f": ["a"]}, f=change("add", "vip")) == {"f": ["a", "vip"]}
    assert apply({"f": ["a", "vip"]}, f=change("add", "vip")) == {"f": ["a", "vip"]}
    assert apply({}, f=change("add", "vip")) == {"f": ["vip"]}
    # And JSON values compare by value, objects included
    assert apply({"f": [{"id": 1}]}, f=change("add", {"id": 1})) == {"f": [{"id": 1}]}


@quick
@given(items=st.lists(json_scalars, max_size=8), value=json_scalars)
def test_adding_twice_is_adding_once(items: list[Any], value: Any) -> None:
    # Given any list, When a value is added twice, Then the list is as after one add
    once = apply({"f": items}, f=change("add", value))
    assert apply(once, f=change("add", value)) == once
    assert value in once["f"]


def test_remove_takes_out_every_equal_item() -> None:
    # Given a list holding the value twice, When it is removed, Then none is left
    assert apply({"f": ["a", "b", "a"]}, f=change("remove", "a")) == {"f": ["b"]}
    assert apply({"f": ["b"]}, f=change("remove", "a")) == {"f": ["b"]}


def test_remove_from_an_absent_list_leaves_it_absent() -> None:
    # Given no field, When a value is removed, Then the field is still absent (not [])
    assert apply({"g": 1}, f=change("remove", "a")) == {"g": 1}


@pytest.mark.parametrize("op", ["append", "add", "remove"])
@pytest.mark.parametrize(
    ("current", "kind"), [("x", "text"), (3, "a number"), (True, "a boolean"), ({}, "an object")]
)
def test_a_list_operation_on_a_non_list_is_not_applicable(op: str, current: Any, kind: str) -> None:
    # Given a field that is not a list, When a list operation touches it
    with pytest.raises(ChangeNotApplicable) as caught:
        apply({"f": current}, f=change(op, "v"))
    # Then the error says which field, which operation and what was there
    assert str(caught.value) == f"{op} on field 'f': current value is {kind}, not a list"


# -- ownership and purity ----------------------------------------------------------------


def test_a_change_to_a_field_the_source_does_not_own_is_refused() -> None:
    # Given a source that owns email and visits
    ownership = FieldOwnership.of(["email", "visits"])
    changes = {
        "email": change("set", "a@b.c"),
        "plan": change("set", "pro"),
        "mrr": change("unset"),
    }
    # When a change also touches plan and mrr, Then all of it is refused, naming both
    with pytest.raises(FieldNotOwned) as caught:
        apply_changes({}, changes, ownership, source="crm")
    assert caught.value.fields == ["mrr", "plan"]
    assert caught.value.source == "crm"
    assert str(caught.value) == "source 'crm' does not own field(s) mrr, plan"


def test_owned_fields_and_the_star_are_writable() -> None:
    # Given a source owning email, and one owning everything
    only_email = FieldOwnership.of(["email"])
    everything = FieldOwnership.of(["*"])
    # When each changes what it owns, Then the change applies
    assert apply_changes({}, {"email": change("set", "x")}, only_email) == {"email": "x"}
    assert apply_changes({}, {"anything": change("set", 1)}, everything) == {"anything": 1}
    assert everything == ALL_FIELDS
    assert only_email.not_owned(["email", "b", "a"]) == ["a", "b"]
    assert FieldOwnership.of([]).not_owned(["a"]) == ["a"]


def test_applying_changes_does_not_modify_the_input_or_share_values() -> None:
    # Given fields with nested values, and changes carrying mutable values
    fields: dict[str, Any] = {"tags": ["a"], "meta": {"n": [1]}, "visits": 1, "gone": 1}
    payload = {"deep": [1, 2]}
    changes = {
        "tags": change("add", "b"),
        "visits": change("increment", 1),
        "gone": change("unset"),
        "meta": change("set", payload),
        "log": change("append", payload),
    }
    snapshot = copy.deepcopy(fields)
    # When they are applied
    out = apply_changes(fields, changes)
    # Then the input is as it was, and the output shares no mutable value with either
    assert fields == snapshot
    out["meta"]["deep"].append(3)
    out["log"][0]["deep"].append(4)
    assert payload == {"deep": [1, 2]}
    assert changes["meta"].value == {"deep": [1, 2]}


def test_a_failed_change_leaves_the_input_untouched() -> None:
    # Given a change whose second operation does not apply
    fields: dict[str, Any] = {"tags": ["a"], "name": "x"}
    changes = {"tags": change("add", "b"), "name": change("increment", 1)}
    # When it is applied, Then it fails and the input is as it was
    with pytest.raises(ChangeNotApplicable):
        apply_changes(fields, changes)
    assert fields == {"tags": ["a"], "name": "x"}


# -- parsing changes ---------------------------------------------------------------------


def test_the_documented_envelope_parses() -> None:
    # Given the envelope from the design brief
    raw = {
        "id": "evt_1",
        "type": "contact.updated",
        "record_key": "contact:42",
        "changes": {"email": {"set": "a@b.c"}, "visits": {"increment": 1}, "tags": {"add": "vip"}},
    }
    # When it is read, Then every change is read with its operation and value
    envelope = Envelope.read(raw)
    changes = {k: Change.model_validate(c) for k, c in envelope.changes.items()}
    assert changes == {
        "email": Change(op="set", value="a@b.c"),
        "visits": Change(op="increment", value=1),
        "tags": Change(op="add", value="vip"),
    }
    # And the changes write back to the same wire form
    assert {k: c.as_wire() for k, c in changes.items()} == raw["changes"]


@pytest.mark.parametrize("raw", [{"unset": True}, {"unset": None}])
def test_unset_takes_true_or_null(raw: dict[str, Any]) -> None:
    # Given an unset written either way, When parsed, Then it is an unset with no value
    assert Change.parse("f", raw) == Change(op="unset", value=None)
    assert Change.parse("f", raw).as_wire() == {"unset": True}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"bump": 1}, "field 'f': unknown operation 'bump' (known: set, unset, increment"),
        ({"set": 1, "unset": True}, "field 'f': a change is an object with exactly one operation"),
        ({}, "a change is an object with exactly one operation"),
        ("set", "a change is an object with exactly one operation"),
        (["set", 1], "a change is an object with exactly one operation"),
        (None, "a change is an object with exactly one operation"),
        ({"increment": "1"}, "field 'f': increment needs a finite number"),
        ({"increment": True}, "increment needs a finite number"),
        ({"increment": None}, "increment needs a finite number"),
        ({"increment": float("nan")}, "increment needs a finite number"),
        ({"increment": float("inf")}, "increment needs a finite number"),
        ({"increment": float("-inf")}, "increment needs a finite number"),
        ({"unset": False}, "field 'f': unset takes true or null"),
        ({"unset": 1.5}, "unset takes true or null"),
    ],
)
def test_an_invalid_change_is_a_value_error_that_says_why(raw: Any, message: str) -> None:
    # Given a malformed change, When it is parsed, Then ValueError names the problem
    with pytest.raises(ValueError) as caught:
        Change.parse("f", raw)
    assert message in str(caught.value)


def test_a_nan_increment_sent_as_json_is_refused() -> None:
    # Given a body carrying NaN, as Python's json module reads it from a sender
    raw = json.loads('{"visits": {"increment": NaN}}')
    # When the changes are parsed, Then NaN is refused
    with pytest.raises(ValueError, match="finite number"):
        parse_changes(raw)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "changes must be a non-empty object"),
        ([], "changes must be a non-empty object"),
        (None, "changes must be a non-empty object"),
        ("x", "changes must be a non-empty object"),
        ({"": {"set": 1}}, f"field names are 1..{MAX_FIELD_CHARS} characters"),
        ({"x" * (MAX_FIELD_CHARS + 1): {"set": 1}}, "field names are 1.."),
        ({"a\nb": {"set": 1}}, "has control characters"),
        ({"a\x00": {"set": 1}}, "has control characters"),
        ({"ok": {"set": 1}, "bad": {"nope": 1}}, "field 'bad': unknown operation 'nope'"),
    ],
)
def test_invalid_changes_are_a_value_error_that_says_why(raw: Any, message: str) -> None:
    # Given a malformed changes object, When it is parsed, Then ValueError names the problem
    with pytest.raises(ValueError) as caught:
        parse_changes(raw)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "raw",
    [
        '{"set": NaN}',
        '{"set": Infinity}',
        '{"append": -Infinity}',
        '{"add": NaN}',
        '{"remove": NaN}',
        '{"set": {"nested": [1, NaN]}}',
    ],
)
def test_a_non_finite_number_anywhere_in_a_value_is_refused(raw: str) -> None:
    # Given a change whose value holds NaN or Infinity, as Python's json reads a body
    parsed = json.loads(raw)
    # When it is parsed, Then it is refused like a NaN increment (it is not JSON)
    with pytest.raises(ValueError, match="finite"):
        Change.parse("f", parsed)


def test_field_name_limits_are_inclusive() -> None:
    # Given the longest allowed field name and the most fields allowed
    longest = "x" * MAX_FIELD_CHARS
    most = {f"f{i}": {"set": i} for i in range(MAX_FIELDS)}
    # When parsed, Then both are accepted
    assert list(parse_changes({longest: {"set": 1}})) == [longest]
    assert len(parse_changes(most)) == MAX_FIELDS


def test_too_many_fields_are_refused() -> None:
    # Given one field more than allowed, When parsed, Then ValueError says the limit
    raw = {f"f{i}": {"set": i} for i in range(MAX_FIELDS + 1)}
    with pytest.raises(ValueError, match=f"at most {MAX_FIELDS} fields"):
        parse_changes(raw)


@quick
@given(
    name=st.text(min_size=1, max_size=MAX_FIELD_CHARS).filter(lambda n: min(map(ord, n)) >= 32),
    value=json_values,
)
def test_any_printable_field_name_and_json_value_parse_and_round_trip(
    name: str, value: Any
) -> None:
    # Given a printable field name and any JSON value, When a set is parsed
    changes = parse_changes({name: {"set": value}})
    # Then it carries the value, and writes back to the form it was read from
    assert changes[name].as_wire() == {"set": value}


# -- envelopes ---------------------------------------------------------------------------


def _envelope(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "id": "evt_1",
        "type": "contact.updated",
        "record_key": "contact:42",
        "changes": {"visits": {"increment": 1}},
    }
    raw.update(overrides)
    return {k: v for k, v in raw.items() if v is not ...}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"extra": 1}, "unknown key(s) 'extra'"),
        ({"id": ""}, f"id must be 1..{MAX_ID_CHARS} characters"),
        ({"id": "x" * (MAX_ID_CHARS + 1)}, f"id must be 1..{MAX_ID_CHARS} characters"),
        ({"id": 1}, "id must be text"),
        ({"record_key": ...}, "record_key is missing"),
        ({"record_key": ""}, "record_key must be 1.."),
        ({"record_key": "k" * (MAX_KEY_CHARS + 1)}, f"record_key must be 1..{MAX_KEY_CHARS}"),
        ({"type": ""}, "type must be 1.."),
        ({"type": None}, "type must be text"),
        ({"changes": ...}, "changes is missing"),
        ({"changes": {}}, "changes: changes must be a non-empty object"),
        ({"changes": {"n": {"increment": "1"}}}, "changes: field 'n': increment needs a finite"),
        ({"changes": {"n": {"increment": True}}}, "increment needs a finite number"),
        ({"changes": {"n": {"set": 1, "add": 2}}}, "exactly one operation"),
        ({"changes": {"n": {"pop": 1}}}, "unknown operation 'pop'"),
    ],
)
def test_an_invalid_envelope_is_refused_naming_the_problem(
    overrides: dict[str, Any], message: str
) -> None:
    # Given an envelope with one thing wrong
    raw = _envelope(**overrides)
    # When it is read, Then the error names the key and says what is wrong, in words
    with pytest.raises(ValueError) as caught:
        Envelope.read(raw)
    assert message in str(caught.value)


@pytest.mark.parametrize("body", [[1, 2], "text", 7, None])
def test_a_body_that_is_not_an_object_is_not_an_envelope(body: Any) -> None:
    with pytest.raises(ValueError, match="must be a JSON object"):
        Envelope.read(body)


@pytest.mark.parametrize("overrides", [{"record_key": "contact:\ud800"}, {"id": "evt_\udc00"}])
def test_an_id_or_key_that_is_not_unicode_is_refused(overrides: dict[str, Any]) -> None:
    # Given an envelope whose id or key has a lone surrogate, as json.loads reads "\\ud800"
    raw = _envelope(**overrides)
    # When it is read, Then it is refused (it could be neither hashed nor stored)
    with pytest.raises(ValueError, match="lone surrogate"):
        Envelope.read(raw)


@pytest.mark.parametrize(
    "changes",
    [
        {"name": {"set": "a\ud800b"}},
        {"tags": {"add": ["\udfff"]}},
        {"\ud800": {"set": 1}},
        {"meta": {"set": {"\ud800": 1}}},
    ],
)
def test_a_change_that_is_not_unicode_is_refused(changes: dict[str, Any]) -> None:
    # Given an envelope whose change carries a lone surrogate
    raw = _envelope(changes=changes)
    # When it is read, Then it is refused like a bad id or key
    with pytest.raises(ValueError, match="lone surrogate"):
        Envelope.read(raw)


def test_an_envelope_without_an_id_is_keyless() -> None:
    # Given an envelope with no id (the receiver then makes one up), When read,
    # Then it is accepted with no id
    assert Envelope.read(_envelope(id=...)).id is None


def test_an_envelope_without_a_type_is_an_event() -> None:
    # Given an envelope with no type, When read, Then its type is "event"
    assert Envelope.read(_envelope(type=...)).type == "event"


def test_an_envelope_at_its_limits_is_accepted() -> None:
    # Given an id and a key of the longest allowed length
    raw = _envelope(id="i" * MAX_ID_CHARS, record_key="k" * MAX_KEY_CHARS)
    # When read, Then it is accepted as sent
    envelope = Envelope.read(raw)
    assert envelope.id == raw["id"]
    assert envelope.record_key == raw["record_key"]

"""routing/contract/mapping.py: references into a delivery's body, headers and query, the
key templates built from them, and the items of a batched delivery."""

from __future__ import annotations

from typing import Any

import pytest

from keylane.routing.contract.mapping import (
    MISSING,
    Delivery,
    check_items,
    check_reference,
    check_template,
    is_reference,
    items_of,
    render,
    resolve,
)

BODY: dict[str, Any] = {
    "data": {"object": {"customer": "cus_1", "amount": 250, "paid": True, "note": ""}},
    "items": [{"id": "it_a"}, {"id": "it_b"}],
    "meta": None,
}
DELIVERY = Delivery(body=BODY, headers={"x-request-id": "req-7"})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("body:data.object.customer", True),
        ("header:X-Request-Id", True),
        ("body:", False),
        ("query:x", True),
        ("delivery:entry.*.id", True),
        ("path:x", False),
        ("customer:{body:data}", False),
        (42, False),
    ],
)
def test_a_reference_is_a_kind_followed_by_where(value: object, expected: bool) -> None:
    assert is_reference(value) is expected


def test_check_reference_returns_a_reference_and_refuses_a_literal() -> None:
    assert check_reference("body:id") == "body:id"
    with pytest.raises(ValueError, match="is not a reference"):
        check_reference("id")


def test_check_template_needs_a_reference_or_a_placeholder() -> None:
    assert check_template("body:id") == "body:id"
    assert check_template("customer:{body:id}") == "customer:{body:id}"
    with pytest.raises(ValueError, match="has no"):
        check_template("customer:{id}")


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("body:data.object.customer", "cus_1"),
        ("body:data.object.amount", 250),
        ("body:items.1.id", "it_b"),
        ("body:data.object", BODY["data"]["object"]),
        ("header:X-REQUEST-ID", "req-7"),
    ],
)
def test_resolve_walks_the_body_and_reads_headers_by_any_case(
    reference: str, expected: object
) -> None:
    assert resolve(reference, DELIVERY) == expected


@pytest.mark.parametrize(
    "reference",
    ["body:data.nope", "body:items.2.id", "body:items.x", "body:meta.x", "header:X-Other"],
)
def test_resolve_says_missing_for_what_is_not_there(reference: str) -> None:
    assert resolve(reference, DELIVERY) is MISSING


def test_a_template_fills_each_placeholder_between_its_literals() -> None:
    template = "c:{body:data.object.customer}/{body:items.0.id}@{header:x-request-id}!"
    assert render(template, DELIVERY) == "c:cus_1/it_a@req-7!"


def test_a_bare_reference_renders_its_value_as_text() -> None:
    assert render("body:data.object.amount", DELIVERY) == "250"


@pytest.mark.parametrize(
    "part",
    [
        "body:data.nope",  # missing
        "body:meta",  # null
        "body:data.object",  # an object
        "body:items",  # a list
        "body:data.object.paid",  # a boolean
        "body:data.object.note",  # empty text
    ],
)
def test_a_template_with_a_missing_or_non_scalar_part_renders_nothing(part: str) -> None:
    # Whether the reference stands alone or inside a template
    assert render(part, DELIVERY) is None
    assert render(f"k:{{{part}}}", DELIVERY) is None


META = {
    "object": "page",
    "entry": [
        {"id": "p1", "changes": [{"field": "leadgen", "value": {"leadgen_id": "L1"}}]},
        # XML and some senders say once what they may say twice: a change, not a list
        {"id": "p2", "changes": {"field": "leadgen", "value": {"leadgen_id": "L2"}}},
    ],
}


def test_items_are_every_element_at_each_star_and_a_single_one_is_a_list_of_one() -> None:
    found = items_of("body:entry.*.changes.*", META)
    assert [(item["value"]["leadgen_id"], at) for item, at in found] == [
        ("L1", (0, 0)),
        ("L2", (1, 0)),
    ]
    assert items_of("body:*", [{"a": 1}, {"a": 2}]) == [({"a": 1}, (0,)), ({"a": 2}, (1,))]
    assert items_of("body:nothing.*", META) == []


def test_an_item_reads_itself_as_body_and_the_whole_delivery_with_its_own_indexes() -> None:
    delivery = Delivery(META, {"x-hub": "1"}, {"key": "k"})
    ((first, at_first), (second, at_second)) = items_of("body:entry.*.changes.*", META)
    for item, at, page in ((first, at_first, "p1"), (second, at_second, "p2")):
        reading = delivery.item(item, at)
        assert render("lead:{delivery:entry.*.id}:{body:value.leadgen_id}", reading) == (
            f"lead:{page}:{item['value']['leadgen_id']}"
        )
        assert resolve("delivery:entry.*.changes.*.field", reading) == "leadgen"
        assert resolve("delivery:object", reading) == "page"
        assert resolve("query:key", reading) == "k"
        assert resolve("header:X-Hub", reading) == "1"
    # Outside a batch, delivery: reads the body
    assert resolve("delivery:object", delivery) == "page"
    assert resolve("query:missing", delivery) is MISSING


def test_items_must_be_a_body_path_with_a_star() -> None:
    assert check_items("body:entry.*.changes.*") == "body:entry.*.changes.*"
    for bad in ("body:entry", "header:x", "delivery:entry.*", "entry.*"):
        with pytest.raises(ValueError, match=r"items|not a reference"):
            check_items(bad)

"""routing/contract/mapping.py: references into a delivery's body and headers, and the
key templates built from them."""

from __future__ import annotations

from typing import Any

import pytest

from keylane.routing.contract.mapping import (
    MISSING,
    Delivery,
    check_reference,
    check_template,
    is_reference,
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
        ("query:x", False),
        ("customer:{body:data}", False),
        (42, False),
    ],
)
def test_a_reference_is_body_or_header_followed_by_where(value: object, expected: bool) -> None:
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

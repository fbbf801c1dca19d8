"""routing/contract/replies.py: Redis replies read the same whatever redis-py returned."""

from __future__ import annotations

import pytest

from keylane.routing.contract.replies import reply_int, reply_text


@pytest.mark.parametrize(
    ("reply", "expected"), [(None, 0), (7, 7), ("12", 12), (b"-3", -3), (2.0, 2)]
)
def test_an_integer_reply_reads_as_an_int_and_nil_as_zero(reply: object, expected: int) -> None:
    value = reply_int(reply)
    assert value == expected
    assert type(value) is int


@pytest.mark.parametrize("reply", [[1], {"n": 1}, object()])
def test_a_reply_that_is_no_number_is_a_type_error(reply: object) -> None:
    with pytest.raises(TypeError, match="not an integer reply"):
        reply_int(reply)


@pytest.mark.parametrize(
    ("reply", "expected"), [(None, ""), (b"caf\xc3\xa9", "café"), ("x", "x"), (5, "5")]
)
def test_a_reply_reads_as_text_and_nil_as_empty(reply: object, expected: str) -> None:
    assert reply_text(reply) == expected

"""Conditions an event may carry on its record: what must hold for its change to apply.

The wire form sits beside ``changes`` in keylane's envelope (and a source's mapping)::

    "conditions": {"slot_owner": {"absent": true}, "stock": {"gte": 1}},
    "if_revision": 7

A field's condition is an object of one or more operators, all of which must hold:

==============  ==================================================================
``absent``      ``true``: the field is not there
``present``     ``true``: the field is there (any value, ``null`` included)
``eq`` / ``ne`` the value equals / does not equal this JSON value (``1`` is not ``true``)
``in``          the value is one of a non-empty list of JSON values
``gt`` ``gte``  numeric bounds: the value is a number and is greater (or equal) /
``lt`` ``lte``  less (or equal) than this finite number
==============  ==================================================================

``if_revision`` (an integer, 0 or more) holds when the record is at exactly that revision:
the one the sender read (0: the record does not exist yet).

This module holds the rules and the parse only (no I/O); a lane checks them on its fresh
read (:mod:`keylane.workers.conditions`), and the write that carries the event's change
(or its refusal) is conditional on that read's revision.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from .values import check_field_name, check_json_value, is_number

ConditionOp = Literal["absent", "present", "eq", "ne", "in", "gt", "gte", "lt", "lte"]
CONDITION_OPS: tuple[str, ...] = get_args(ConditionOp)
#: The operators that compare numbers.
BOUNDS = frozenset({"gt", "gte", "lt", "lte"})
#: The most fields one event may carry conditions on, and values in one ``in`` list.
MAX_CONDITIONS = 64
MAX_IN_VALUES = 256

#: A field's conditions as checked (``{op: operand}``), by field name.
WireConditions = dict[str, dict[str, Any]]


def check_conditions(raw: object) -> WireConditions:
    """Validate a ``conditions`` object (see the module docstring); ``ValueError`` names
    the field and the operator that is wrong."""
    if not isinstance(raw, dict) or not raw:
        raise ValueError("conditions must be a non-empty object of field -> condition")
    if len(raw) > MAX_CONDITIONS:
        raise ValueError(f"at most {MAX_CONDITIONS} fields may carry conditions")
    out: WireConditions = {}
    for field, condition in raw.items():
        check_field_name(field)
        out[field] = check_condition(field, condition)
    return out


def check_condition(field: str, raw: object) -> dict[str, Any]:
    """One field's condition, ``{op: operand, ...}``; ``ValueError`` says what is wrong."""
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"field {field!r}: a condition is an object of operators")
    for op, operand in raw.items():
        where = f"field {field!r}: {op}"
        if op not in CONDITION_OPS:
            known = ", ".join(CONDITION_OPS)
            raise ValueError(f"field {field!r}: unknown condition operator {op!r} (known: {known})")
        if op in ("absent", "present") and operand is not True:
            raise ValueError(f"{where} takes true")
        if op in BOUNDS and not is_number(operand):
            raise ValueError(f"{where} needs a finite number, not {operand!r}")
        if op == "in" and (not isinstance(operand, list) or not operand):
            raise ValueError(f"{where} needs a non-empty list of values")
        if op == "in" and len(operand) > MAX_IN_VALUES:
            raise ValueError(f"{where} takes at most {MAX_IN_VALUES} values")
        check_json_value(operand, where)
    if "absent" in raw and len(raw) > 1:
        raise ValueError(f"field {field!r}: absent cannot be combined with another operator")
    return dict(raw)


def check_if_revision(raw: object) -> int:
    """An ``if_revision``: an integer, 0 or more; ``ValueError`` otherwise."""
    if type(raw) is not int or raw < 0:
        raise ValueError("if_revision must be an integer, 0 or more (0: the record is absent)")
    return raw

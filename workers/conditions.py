"""Checking an event's conditions on the record as freshly read: pure, no I/O.

The lane checks them on every attempt's fresh read; the write that carries the change,
or the refusal, is conditional on that read's revision, so "the slot is free" and "book
it" are one step (see :mod:`keylane.routing.contract.conditions` for the wire form).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..routing.contract.conditions import WireConditions
from ..routing.contract.values import is_number
from .changes import kind_of

_ABSENT = object()


#: The reason of a refusal by an event's own conditions (a task names its own).
REFUSED_BY_CONDITION = "condition_unmet"


@dataclass(frozen=True)
class Unmet:
    """The first condition that did not hold: what a refusal's journal entry keeps."""

    condition: dict[str, Any]  # as sent: {field: {op: operand}} or {"if_revision": n}
    field: str | None
    seen: Any
    revision: int
    why: str

    def as_result(self) -> dict[str, Any]:
        """The refusal's result, JSON-ready."""
        return {
            "reason": REFUSED_BY_CONDITION,
            "condition": self.condition,
            "field": self.field,
            "seen": self.seen,
            "revision": self.revision,
            "why": self.why,
        }


def check_conditions(
    conditions: WireConditions | None,
    if_revision: int | None,
    fields: Mapping[str, Any],
    revision: int,
) -> Unmet | None:
    """The first unmet condition on a record at ``revision`` with ``fields``, or None
    when all hold (``if_revision`` first, then each field in the order sent)."""
    if if_revision is not None and if_revision != revision:
        moved = f"the record is at revision {revision}, not {if_revision}"
        return Unmet({"if_revision": if_revision}, None, revision, revision, moved)
    for name, condition in (conditions or {}).items():
        value = fields.get(name, _ABSENT)
        for op, operand in condition.items():
            why = _unmet(name, op, operand, value)
            if why is not None:
                seen = None if value is _ABSENT else value
                return Unmet({name: condition}, name, seen, revision, why)
    return None


def _unmet(name: str, op: str, operand: Any, value: Any) -> str | None:
    """Why ``value`` (``_ABSENT``: no such field) fails ``{op: operand}``; None if it holds."""
    absent = value is _ABSENT
    if op == "absent":
        return None if absent else f"{name} is present ({_show(value)})"
    if op == "present":
        return f"{name} is absent" if absent else None
    if op == "eq":
        return None if not absent and same(value, operand) else f"{name} is {_show(value)}"
    if op == "ne":
        return None if absent or not same(value, operand) else f"{name} is {_show(value)}"
    if op == "in":
        found = not absent and any(same(value, item) for item in operand)
        return None if found else f"{name} is {_show(value)}, not one of {operand!r}"
    if absent:
        return f"{name} is absent, not a number"
    if not is_number(value):
        return f"{name} is {kind_of(value)}, not a number: {op} {operand} cannot hold"
    return None if _BOUNDS[op](value, operand) else f"{name} is {value}, not {_SIGNS[op]} {operand}"


_BOUNDS = {
    "gt": lambda a, b: a > b,
    "gte": lambda a, b: a >= b,
    "lt": lambda a, b: a < b,
    "lte": lambda a, b: a <= b,
}
_SIGNS = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}


def same(a: Any, b: Any) -> bool:
    """Equality as JSON sees it: ``1`` equals ``1.0`` but not ``true``, at any depth."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return False
    return bool(a == b)


def _show(value: Any) -> str:
    return "absent" if value is _ABSENT else repr(value)

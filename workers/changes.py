"""Applying a change to a record's fields: pure functions, no I/O.

The lane re-runs these on a fresh read after every version conflict, which is why a change
is a list of operations (increment by 1) and not a computed value (set to 11).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from ..routing.contract.errors import ChangeNotApplicable, FieldNotOwned
from ..routing.contract.events import Change
from ..routing.contract.sources import ALL_FIELDS, FieldOwnership


def apply_changes(
    fields: Mapping[str, Any],
    changes: Mapping[str, Change],
    ownership: FieldOwnership = ALL_FIELDS,
    source: str = "",
) -> dict[str, Any]:
    """Return ``fields`` with ``changes`` applied; the input is not modified.

    Raises :class:`FieldNotOwned` when a change touches a field the source does not own,
    and :class:`ChangeNotApplicable` when an operation does not fit the current value.
    """
    stray = ownership.not_owned(changes)
    if stray:
        raise FieldNotOwned(source, stray)
    out = copy.deepcopy(dict(fields))
    for name, change in changes.items():
        _apply_one(out, name, change)
    return out


def _apply_one(fields: dict[str, Any], name: str, change: Change) -> None:
    current = fields.get(name)
    if change.op == "set":
        fields[name] = copy.deepcopy(change.value)
    elif change.op == "unset":
        fields.pop(name, None)
    elif change.op == "increment":
        fields[name] = _increment(name, current, change.value)
    elif change.op == "remove" and current is None:
        return  # removing from a list that does not exist leaves it absent
    else:
        fields[name] = _list_op(name, current, change)


def _increment(name: str, current: Any, by: int | float) -> int | float:
    if current is None:
        return by
    if isinstance(current, bool) or not isinstance(current, int | float):
        raise ChangeNotApplicable(
            name, "increment", f"current value is {kind_of(current)}, not a number"
        )
    try:
        total = current + by
    except OverflowError:
        total = math.inf
    if isinstance(total, float) and not math.isfinite(total):
        raise ChangeNotApplicable(name, "increment", "the result is not a finite number")
    return total


def _list_op(name: str, current: Any, change: Change) -> list[Any]:
    if current is None:
        current = []
    if not isinstance(current, list):
        raise ChangeNotApplicable(
            name, change.op, f"current value is {kind_of(current)}, not a list"
        )
    items = list(current)
    if change.op == "append":
        items.append(copy.deepcopy(change.value))
    elif change.op == "add":
        if change.value not in items:
            items.append(copy.deepcopy(change.value))
    else:  # remove
        items = [item for item in items if item != change.value]
    return items


def kind_of(value: Any) -> str:
    """A value's kind in words ("text", "a number", ...), for errors and refusals."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "text"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, int | float):
        return "a number"
    return type(value).__name__

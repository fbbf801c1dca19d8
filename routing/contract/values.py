"""What a value sent to keylane may be: text every store can keep, JSON that JSON can carry
faithfully, a field name, a number. The rules of changes (:mod:`.events`) and of conditions
(:mod:`.conditions`) both use them."""

from __future__ import annotations

import math
from typing import Any

MAX_FIELD_CHARS = 128


def is_number(value: object) -> bool:
    """A finite int or float, not a boolean."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not (isinstance(value, float) and not math.isfinite(value))


def check_text(text: str, what: str, allow_nul: bool = False) -> str:
    """``text`` if every store can keep it: no lone surrogate (not encodable as UTF-8) and,
    for what is stored as a text column (ids, keys, field names), no NUL, which PostgreSQL
    refuses. Inside JSON values a NUL is fine: JSON writes it as ``\u0000``. Raises
    ``ValueError`` naming ``what``."""
    if not allow_nul and "\x00" in text:
        raise ValueError(f"{what} contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid Unicode (a lone surrogate)") from None
    return text


def check_json_value(value: Any, what: str) -> None:
    """Refuse what JSON cannot carry faithfully: NaN/Infinity anywhere (``json.loads``
    reads them, JSON has no such numbers) and text that is not valid Unicode."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{what}: numbers must be finite (no NaN or Infinity)")
        if isinstance(item, str):
            check_text(item, what, allow_nul=True)
        elif isinstance(item, dict):
            for key, inner in item.items():
                check_text(str(key), what, allow_nul=True)
                stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)


def check_field_name(field: object) -> None:
    """Field names are short, printable and non-empty."""
    if not isinstance(field, str) or not field or len(field) > MAX_FIELD_CHARS:
        raise ValueError(f"field names are 1..{MAX_FIELD_CHARS} characters")
    if any(ord(c) < 32 for c in field):
        raise ValueError(f"field name {field!r} has control characters")
    check_text(field, "a field name")

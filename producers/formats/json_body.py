"""JSON bodies, parsed by msgspec: it reads exactly what RFC 8259 allows, so ``NaN``,
``Infinity`` and numbers too large for a double (``1e400``) are not JSON to it (Python's
``json`` turns them into floats JSON cannot carry), integers keep every digit, and text
that is not UTF-8 or holds a lone surrogate is refused with the rest."""

from __future__ import annotations

import codecs
from typing import Any

import msgspec

from ...routing.contract.errors import InvalidEvent
from .limits import MAX_DEPTH, too_deep

_DECODE = msgspec.json.Decoder().decode


def parse_json(body: bytes, where: str = "body") -> Any:
    """The parsed JSON, or 400: not JSON (``malformed_json``, non-finite numbers
    included), or nested deeper than ``MAX_DEPTH`` (``too_deep``). ``where`` names
    what is parsed in the error (the body, or a field holding JSON)."""
    text = body[3:] if body.startswith(codecs.BOM_UTF8) else body  # a BOM is no JSON
    try:
        payload = _DECODE(text)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidEvent(f"{where} is not valid JSON: {exc}", code="malformed_json") from None
    except RecursionError:
        raise too_deep("JSON") from None
    # Nesting needs an opening bracket per level: a body with fewer of them than the
    # limit (counted in C, strings included) cannot be too deep, and needs no walk.
    openers = body.count(b"[") + body.count(b"{")
    if openers >= MAX_DEPTH and deeper_than(payload, MAX_DEPTH):
        raise too_deep("JSON")
    return payload


def deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` levels, counting every value (a
    scalar alone is one level, ``[1]`` two), read one level of containers at a time."""
    level = [value] if isinstance(value, dict | list) else []
    depth = 1
    while level and depth <= limit:
        inner: list[Any] = []
        reached = False
        for item in level:
            for child in item.values() if isinstance(item, dict) else item:
                reached = True
                if isinstance(child, dict | list):
                    inner.append(child)
        depth += reached
        level = inner
    return depth > limit

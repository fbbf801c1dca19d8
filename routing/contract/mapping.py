"""Reading a delivery's parts: references into the body or headers, and key templates.

A *reference* names where a value lives:

* ``body:data.object.customer`` — a dotted path into the JSON body (list items by index:
  ``body:items.0.id``);
* ``header:X-Request-Id`` — a request header (case-insensitive).

A *template* builds a string from references: ``"customer:{body:data.object.customer}"``.
A template that is a single reference without braces yields the value itself.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_REFERENCE = re.compile(r"^(body|header):(.+)$")
_PLACEHOLDER = re.compile(r"\{((?:body|header):[^{}]+)\}")

MISSING = object()


@dataclass(frozen=True)
class Delivery:
    """What a reference can read: the parsed body and the headers (lowercased names)."""

    body: Any
    headers: Mapping[str, str]


def is_reference(value: object) -> bool:
    """Whether ``value`` is a ``body:``/``header:`` reference (else it is a literal)."""
    return isinstance(value, str) and _is_reference(value)


@functools.lru_cache(maxsize=1024)
def _is_reference(value: str) -> bool:
    return _REFERENCE.match(value) is not None


def check_reference(value: str) -> str:
    """``value`` if it is a well-formed reference; ``ValueError`` otherwise."""
    if not is_reference(value):
        raise ValueError(f"{value!r} is not a reference (body:<path> or header:<name>)")
    return value


def check_template(template: str) -> str:
    """``template`` if it is a reference or contains at least one ``{reference}``."""
    if is_reference(template) or _PLACEHOLDER.search(template):
        return template
    raise ValueError(f"{template!r} has no {{body:...}} or {{header:...}} part")


def resolve(reference: str, delivery: Delivery) -> Any:
    """The value at ``reference``, or :data:`MISSING`."""
    kind, where = _reference(reference)
    if kind == "header":
        return delivery.headers.get(where[0], MISSING)
    return _walk(delivery.body, where)


# A source's references and templates are few and read on every delivery: each is parsed
# once.
@functools.lru_cache(maxsize=1024)
def _reference(reference: str) -> tuple[str, tuple[str, ...]]:
    """``(kind, path parts)`` of a reference; a header's one part is its lowercased name."""
    match = _REFERENCE.match(reference)
    if match is None:
        raise ValueError(f"not a reference: {reference!r}")
    kind, where = match.groups()
    return kind, (where.lower(),) if kind == "header" else tuple(where.split("."))


@functools.lru_cache(maxsize=1024)
def _template(template: str) -> tuple[tuple[str, str | None], ...]:
    """A template as (literal text before it, reference) pairs; the last pair's
    reference is None (the text after the last placeholder)."""
    pairs: list[tuple[str, str | None]] = []
    last = 0
    for match in _PLACEHOLDER.finditer(template):
        pairs.append((template[last : match.start()], match.group(1)))
        last = match.end()
    pairs.append((template[last:], None))
    return tuple(pairs)


def _walk(value: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if isinstance(value, dict):
            if part not in value:
                return MISSING
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return MISSING
    return value


def render(template: str, delivery: Delivery) -> str | None:
    """The string ``template`` builds, or None when a part is missing or not a scalar."""
    if is_reference(template):
        return _scalar_text(resolve(template, delivery))
    parts: list[str] = []
    for literal, reference in _template(template):
        parts.append(literal)
        if reference is not None:
            text = _scalar_text(resolve(reference, delivery))
            if text is None:
                return None
            parts.append(text)
    return "".join(parts)


def _scalar_text(value: Any) -> str | None:
    if value is MISSING or value is None or isinstance(value, dict | list | bool):
        return None
    text = str(value)
    return text if text else None

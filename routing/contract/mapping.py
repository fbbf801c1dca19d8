"""Reading a delivery's parts: references into the body, headers and query, key
templates, and the items of a batched delivery.

A *reference* names where a value lives:

* ``body:data.object.customer`` — a dotted path into the body's tree (JSON, or a form,
  multipart or XML body read as one: ``producers/formats/``; list items by index:
  ``body:items.0.id``); in a batched delivery, into the item;
* ``delivery:entry.*.id`` — a path into the whole body of a batched delivery, each ``*``
  standing for the index of the item being read at that level (Meta's ``entry[].id`` of
  the entry an item is in); outside a batch, the same as ``body:``;
* ``header:X-Request-Id`` — a request header (case-insensitive);
* ``query:token`` — a parameter of the URL the sender called (its first value);
* ``item:index`` — in a batched delivery, the item's position among the delivery's items
  (0, 1, ...): with a delivery-wide id (Attio's ``Idempotency-Key`` header), each item's
  own, ``{header:Idempotency-Key}:{item:index}``; outside a batch, nothing.

A *template* builds a string from references: ``"customer:{body:data.object.customer}"``.
A template that is a single reference without braces yields the value itself.

A source's *items* (``items = "body:entry.*.changes.*"``) says where the events of a
batched delivery are: each ``*`` is every item of a list at that level (a value that is
not a list is a list of one: XML says once what it may say twice); ``body:*`` is a body
that is itself a list (HubSpot's).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_REFERENCE = re.compile(r"^(body|header|query|delivery):(.+)$|^(item):(index)$")
_PLACEHOLDER = re.compile(r"\{((?:body|header|query|delivery):[^{}]+|item:index)\}")
EVERY = "*"

MISSING: Any = object()


@dataclass(frozen=True)
class Delivery:
    """What a reference can read: the body's tree (in a batch, the item's), the headers
    (lowercased names), the URL's query parameters, and for an item of a batch the whole
    body and the item's index at each ``*`` of the source's ``items``."""

    body: Any
    headers: Mapping[str, str]
    query: Mapping[str, str] = field(default_factory=dict)
    whole: Any = MISSING
    at: tuple[int, ...] = ()
    index: int | None = None

    def item(self, item: Any, at: tuple[int, ...], index: int | None = None) -> Delivery:
        """The delivery as an item of it reads it (``body:`` is the item; ``index``: its
        position among the delivery's items)."""
        return Delivery(item, self.headers, self.query, self.body, at, index)


def is_reference(value: object) -> bool:
    """Whether ``value`` is a ``body:``/``header:`` reference (else it is a literal)."""
    return isinstance(value, str) and _is_reference(value)


@functools.lru_cache(maxsize=1024)
def _is_reference(value: str) -> bool:
    return _REFERENCE.match(value) is not None


def check_reference(value: str) -> str:
    """``value`` if it is a well-formed reference; ``ValueError`` otherwise."""
    if not is_reference(value):
        raise ValueError(
            f"{value!r} is not a reference (body:<path>, delivery:<path>, header:<name>, "
            "query:<name> or item:index)"
        )
    return value


def check_items(value: str) -> str:
    """``value`` if it is a ``body:`` path with at least one ``*`` part; ``ValueError``
    otherwise."""
    kind, path = _reference(check_reference(value))
    if kind != "body" or EVERY not in path:
        raise ValueError(f"items: {value!r} is not a body:<path> with a * part (body:*)")
    return value


def check_template(template: str) -> str:
    """``template`` if it is a reference or contains at least one ``{reference}``."""
    if is_reference(template) or _PLACEHOLDER.search(template):
        return template
    raise ValueError(
        f"{template!r} is not a reference (body:<path>, header:<name>, query:<name>), and as "
        "a template it has no {body:...}, {header:...} or {query:...} part"
    )


def resolve(reference: str, delivery: Delivery) -> Any:
    """The value at ``reference``, or :data:`MISSING`."""
    kind, where = _reference(reference)
    if kind == "body":
        return _walk(delivery.body, where)
    if kind == "header":
        return delivery.headers.get(where[0], MISSING)
    if kind == "query":
        return delivery.query.get(where[0], MISSING)
    if kind == "item":
        return MISSING if delivery.index is None else delivery.index
    if delivery.whole is MISSING:  # not a batch: the whole body is the body
        return _walk(delivery.body, where)
    return _walk_at(delivery.whole, where, delivery.at)


def _walk_at(value: Any, path: tuple[str, ...], at: tuple[int, ...]) -> Any:
    """``path`` walked in ``value`` with its ``*`` parts, in order, standing for the
    indexes ``at`` (a value that is not a list is a list of one, as for items)."""
    indexes = iter(at)
    for part in path:
        if part != EVERY:
            value = _walk(value, (part,))
            continue
        listed, index = _listed(value), next(indexes, None)
        if index is None or index >= len(listed):
            return MISSING
        value = listed[index]
    return value


def items_of(reference: str, body: Any) -> list[tuple[Any, tuple[int, ...]]]:
    """The items a ``body:`` path with ``*`` parts selects, each with its index at each
    ``*`` (see the module docstring); none when the path is absent."""
    kind, path = _reference(reference)
    assert kind == "body"
    found: list[tuple[Any, tuple[int, ...]]] = [(body, ())]
    start = 0
    for position, part in enumerate(path):
        if part != EVERY:
            continue
        step = path[start:position]
        found = [
            (child, (*at, index))
            for value, at in found
            for index, child in enumerate(_listed(_walk(value, step)))
        ]
        start = position + 1
    return [(_walk(value, path[start:]), at) for value, at in found if value is not MISSING]


def _listed(value: Any) -> list[Any]:
    if value is MISSING:
        return []
    return value if isinstance(value, list) else [value]


# A source's references and templates are few and read on every delivery: each is parsed
# once.
@functools.lru_cache(maxsize=1024)
def _reference(reference: str) -> tuple[str, tuple[str, ...]]:
    """``(kind, path parts)`` of a reference; a header's one part is its lowercased name,
    a query parameter's its name."""
    match = _REFERENCE.match(reference)
    if match is None:
        raise ValueError(f"not a reference: {reference!r}")
    body_like, path, item, index = match.groups()
    kind, where = (body_like, path) if body_like is not None else (item, index)
    if kind == "header":
        return kind, (where.lower(),)
    if kind == "query":
        return kind, (where,)
    return kind, tuple(where.split("."))


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

"""``application/x-www-form-urlencoded`` bodies (Twilio, Mailchimp, Slack's interactivity,
ActiveCampaign) as one tree, read the way PHP, Rails and ``qs`` read bracketed keys:

* ``a=1`` gives ``{"a": "1"}``; every value is text, as sent;
* ``a[b][c]=1`` nests: ``{"a": {"b": {"c": "1"}}}`` (``body:a.b.c``);
* ``a[]=1&a[]=2`` and a plain key repeated (``a=1&a=2``) give a list, in order;
* ``a[0]=x`` keeps ``"0"`` as a key (``body:a.0`` reads it, as it reads a list's item);
* a key that is both a value and a group (``a=1&a[b]=2``) is a 400 naming it, never a
  guess; so is a key nested deeper than the limit, or more fields than the limit.

A key whose brackets do not close (``a[b``) is a name as written.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl

from ...routing.contract.errors import InvalidEvent
from .limits import MAX_DEPTH, MAX_FIELDS, too_deep

_KEY = re.compile(r"([^\[\]]+)((?:\[[^\[\]]*\])*)")
_PART = re.compile(r"\[([^\[\]]*)\]")


def parse_form(body: bytes, charset: str = "utf-8") -> dict[str, Any]:
    """The tree of a form body; :class:`InvalidEvent` (400) when it cannot be one."""
    try:
        text = body.decode(charset)
    except (UnicodeDecodeError, LookupError) as exc:
        raise InvalidEvent(f"form body is not {charset}: {exc}", code="malformed_form") from None
    try:
        pairs = parse_qsl(
            text,
            keep_blank_values=True,
            max_num_fields=MAX_FIELDS,
            separator="&",
            encoding=charset,
            errors="strict",
        )
    except UnicodeDecodeError as exc:  # a %-escape that is not text in its charset
        raise InvalidEvent(f"form body is not {charset}: {exc}", code="malformed_form") from None
    except ValueError as exc:  # over max_num_fields
        raise InvalidEvent(f"form body: {exc}", code="too_many_fields") from None
    return nest(pairs)


def nest(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Fields (name, value) as one tree by the rules of the module docstring; also for
    the text fields of a multipart body."""
    tree: dict[str, Any] = {}
    for name, value in pairs:
        _put(tree, key_path(name), value, name)
    return tree


def key_path(name: str) -> list[str]:
    """The path a field name addresses: ``a[b][]`` is ``["a", "b", ""]`` (``""``: append)."""
    match = _KEY.fullmatch(name)
    if match is None:
        return [name]
    path = [match.group(1), *_PART.findall(match.group(2))]
    if len(path) > MAX_DEPTH:
        raise too_deep(f"form field {name[:64]!r}")
    if "" in path[:-1]:
        raise InvalidEvent(
            f"form field {name[:64]!r}: [] is read only at the end of a name",
            code="malformed_form",
        )
    return path


def _put(tree: dict[str, Any], path: list[str], value: Any, name: str) -> None:
    appends = path[-1] == "" and len(path) > 1
    if appends:
        path = path[:-1]
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise _conflict(name)
        node = child
    last = path[-1]
    held = node.get(last)
    if isinstance(held, dict):
        raise _conflict(name)
    if held is None:
        node[last] = [value] if appends else value
    else:  # a repeated key, or another a[]: a list, in the order sent
        node[last] = [*held, value] if isinstance(held, list) else [held, value]


def _conflict(name: str) -> InvalidEvent:
    return InvalidEvent(
        f"form field {name[:64]!r} is both a value and a group of fields",
        code="form_conflict",
    )

"""A delivery's body as one tree, whatever its media type: what ``body:<path>`` reads.

* JSON (``application/json``, ``application/*+json``): :mod:`.json_body`;
* forms (``application/x-www-form-urlencoded``), bracketed keys nested: :mod:`.form`;
* ``multipart/form-data``, text fields by name, files as their name, size and digest:
  :mod:`.multipart`;
* XML (``text/xml``, ``application/xml``, ``application/*+xml``; SOAP 1.1 included),
  without DTDs or entities: :mod:`.xml_body`.

A source may name its format (``body = "json"``) for a sender that declares another
media type than it sends, and fields whose text is JSON (``json_fields =
["rawRequest"]``: Jotform's answers, Slack's ``payload``), read in place. Any other media
type is a 415. Every failure is an :class:`~keylane.routing.contract.errors.InvalidEvent`
with its status, and nothing is recorded for it.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from typing import Any

import msgspec

from ...routing.contract.errors import InvalidEvent
from .form import parse_form
from .json_body import parse_json
from .multipart import parse_multipart
from .xml_body import parse_xml

__all__ = ["canonical_json", "digest_of", "format_of", "media_type", "parse_json", "read_tree"]

_SORTED = msgspec.json.Encoder(order="sorted").encode

_BY_MEDIA_TYPE = {
    "application/json": "json",
    "application/x-www-form-urlencoded": "form",
    "multipart/form-data": "multipart",
    "text/xml": "xml",
    "application/xml": "xml",
}
ACCEPTED = "JSON, a form, multipart/form-data or XML"


def media_type(content_type: str) -> str:
    """The media type of a ``content-type`` value, lowercased, without parameters."""
    return content_type.split(";", 1)[0].strip().lower()


def format_of(content_type: str, declared: str = "auto") -> str:
    """The format to read a body in: the source's own (``declared``), else the one its
    media type says; 415 for any other media type."""
    if declared != "auto":
        return declared
    media = media_type(content_type)
    found = _BY_MEDIA_TYPE.get(media)
    if found is not None:
        return found
    if media.startswith("application/") and media.endswith("+json"):
        return "json"
    if media.startswith("application/") and media.endswith("+xml"):
        return "xml"
    raise InvalidEvent(
        f"expected {ACCEPTED}, got {media or 'no content type'}",
        status=415,
        code="unsupported_media_type",
    )


def read_tree(
    body: bytes, content_type: str, form: str = "json", json_fields: Sequence[str] = ()
) -> Any:
    """The tree of ``body`` read in format ``form`` (:func:`format_of`), with the
    ``json_fields`` read in place."""
    if form == "json":
        tree = parse_json(body)
    elif form == "form":
        tree = parse_form(body, _charset(content_type))
    elif form == "multipart":
        tree = parse_multipart(body, content_type)
    else:
        tree = parse_xml(body)
    for path in json_fields:
        _read_json_field(tree, path)
    return tree


def _charset(content_type: str) -> str:
    for param in content_type.split(";")[1:]:
        name, _, value = param.strip().partition("=")
        if name.strip().lower() == "charset" and value.strip():
            return value.strip().strip('"')
    return "utf-8"


def _read_json_field(tree: Any, path: str) -> None:
    """The text at ``path`` (dotted) replaced by the JSON it holds; a field absent or not
    text is left as it is, a field whose text is not JSON is a 400 naming it."""
    *parents, last = path.split(".")
    node = tree
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and isinstance(node.get(last), str):
        node[last] = parse_json(node[last].encode(), f"field {path}")


def canonical_json(tree: Any) -> bytes:
    """``tree`` as JSON written one way (keys sorted, no spaces): what a task gets of an
    item of a batched delivery, or of a body that was not JSON."""
    return _SORTED(tree)


def digest_of(tree: Any, excludes: Sequence[str] = ()) -> str:
    """The digest that tells a retry (the same) from an id reused with another body, of
    a tree read from a body or an item: its canonical JSON without the ``excludes``
    (dotted paths of fields a sender changes when it retries)."""
    if excludes:
        tree = copy.deepcopy(tree)
        for path in excludes:
            *parents, last = path.split(".")
            node = tree
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(last, None)
    return hashlib.sha256(canonical_json(tree)).hexdigest()

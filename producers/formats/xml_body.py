"""XML bodies, SOAP 1.1 included (Salesforce's outbound messages), as one tree, parsed by
defusedxml: a DTD, an entity declaration or an external reference is a 400 before any of
it is expanded or fetched.

The tree, like the common XML-to-JSON readings:

* the root element is the one key of the tree: ``body:Envelope.Body...``;
* names are local (namespace prefixes and URIs dropped): ``soapenv:Envelope`` is
  ``Envelope``, ``sf:Email`` is ``Email``;
* an element with neither children nor attributes is its text (``""`` when empty); with
  ``xsi:nil="true"`` it is ``null``;
* otherwise a mapping: children by name (a name repeated is a list, in order),
  attributes as ``@name`` (``@type`` for ``xsi:type``, namespace declarations left out),
  and its text, if any, as ``#text``.

A name that comes once is a mapping or text, not a list: an ``items`` path reads a
single one as a list of one (:mod:`keylane.routing.contract.mapping`).
"""

from __future__ import annotations

from typing import Any
from xml.etree.ElementTree import Element, ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring

from ...routing.contract.errors import InvalidEvent
from .limits import MAX_DEPTH, too_deep

XSI = "{http://www.w3.org/2001/XMLSchema-instance}"


def parse_xml(body: bytes) -> dict[str, Any]:
    """The tree of an XML body; 400 when it is not well-formed XML, declares a DTD or
    entities, or nests deeper than the limit."""
    try:
        root = fromstring(body, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except DefusedXmlException as exc:
        raise InvalidEvent(
            f"XML body refused: {type(exc).__name__} (DTDs, entities and external "
            "references are not read)",
            code="xml_forbidden",
        ) from None
    except ParseError as exc:
        raise InvalidEvent(f"body is not well-formed XML: {exc}", code="malformed_xml") from None
    return {local_name(root.tag): _value(root, 1)}


def local_name(tag: str) -> str:
    """``{uri}name`` or ``prefix:name`` without its namespace."""
    return tag.rpartition("}")[2].rpartition(":")[2]


def _value(element: Element, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise too_deep("XML")
    if element.get(XSI + "nil") in ("true", "1"):
        return None
    attributes = {
        "@" + local_name(name): value
        for name, value in element.attrib.items()
        if not name.startswith(XSI + "nil")
    }
    text = (element.text or "").strip()
    if not len(element) and not attributes:
        return element.text or ""
    tree: dict[str, Any] = dict(attributes)
    listed: set[str] = set()  # the names already made lists (a child is never one)
    for child in element:
        name = local_name(child.tag)
        value = _value(child, depth + 1)
        if name in listed:
            tree[name].append(value)
        elif name in tree:
            tree[name] = [tree[name], value]
            listed.add(name)
        else:
            tree[name] = value
    if text:
        tree["#text"] = text
    return tree

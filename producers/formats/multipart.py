"""``multipart/form-data`` bodies (Jotform, Gravity Forms, form builders' file uploads) as
one tree: each text field by its name, with the bracket rules of :mod:`.form`; a file
part as what it is, never its bytes: ``{"filename", "content_type", "size", "sha256"}``.

Parsed by python-multipart from the body already read (whole, within the receiver's body
limit). A body without a boundary, one that is not well-formed, a text field over
:data:`~.limits.MAX_FIELD_BYTES` or more parts than :data:`~.limits.MAX_FIELDS` is a 4xx
naming what is wrong.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from ...routing.contract.errors import InvalidEvent
from .form import nest
from .limits import MAX_FIELD_BYTES, MAX_FIELDS

# python-multipart logs each malformed body as a warning before it raises: the 400 says
# why, and a sender's bad body is not the operator's warning.
logging.getLogger("python_multipart.multipart").setLevel(logging.ERROR)


class _Part:
    __slots__ = ("digest", "headers", "size", "text")

    def __init__(self) -> None:
        self.headers: dict[bytes, bytes] = {}
        self.text: list[bytes] = []
        self.digest = hashlib.sha256()
        self.size = 0


class _Collector:
    """python-multipart's callbacks: each part's headers and bytes, text kept, files hashed."""

    def __init__(self) -> None:
        self.parts: list[_Part] = []
        self._field = b""
        self._value = b""

    def begin(self) -> None:
        if len(self.parts) >= MAX_FIELDS:
            raise InvalidEvent(
                f"multipart body has more than {MAX_FIELDS} parts", code="too_many_fields"
            )
        self.parts.append(_Part())

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def header_end(self) -> None:
        self.parts[-1].headers[self._field.strip().lower()] = self._value.strip()
        self._field = self._value = b""

    def data(self, data: bytes, start: int, end: int) -> None:
        part = self.parts[-1]
        chunk = data[start:end]
        part.size += len(chunk)
        if _filename(part) is None:
            if part.size > MAX_FIELD_BYTES:
                raise InvalidEvent(
                    f"multipart field {_name(part)!r} is over {MAX_FIELD_BYTES} bytes",
                    status=413,
                    code="part_too_large",
                )
            part.text.append(chunk)
        else:
            part.digest.update(chunk)


def parse_multipart(body: bytes, content_type: str) -> dict[str, Any]:
    """The tree of a multipart body declared with ``content_type`` (its boundary)."""
    _, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if not boundary:
        raise InvalidEvent("multipart body without a boundary", code="malformed_multipart")
    collect = _Collector()
    callbacks: Any = {
        "on_part_begin": collect.begin,
        "on_header_field": collect.header_field,
        "on_header_value": collect.header_value,
        "on_header_end": collect.header_end,
        "on_part_data": collect.data,
    }
    parser = MultipartParser(boundary, callbacks)
    try:
        parser.write(body)
        parser.finalize()
    except MultipartParseError as exc:
        raise InvalidEvent(f"multipart body: {exc}", code="malformed_multipart") from None
    if not collect.parts or parser.state.name != "END":
        raise InvalidEvent("multipart body does not end", code="malformed_multipart")
    return nest([(_name(part), _value(part)) for part in collect.parts])


def _disposition(part: _Part) -> dict[bytes, bytes]:
    return parse_options_header(part.headers.get(b"content-disposition", b""))[1]


def _name(part: _Part) -> str:
    name = _disposition(part).get(b"name")
    if name is None:
        raise InvalidEvent("multipart part without a name", code="malformed_multipart")
    return name.decode("utf-8", "replace")


def _filename(part: _Part) -> bytes | None:
    return _disposition(part).get(b"filename")


def _value(part: _Part) -> Any:
    filename = _filename(part)
    if filename is None:
        try:
            return b"".join(part.text).decode()
        except UnicodeDecodeError:
            raise InvalidEvent(
                f"multipart field {_name(part)!r} is not UTF-8 text", code="malformed_multipart"
            ) from None
    return {
        "filename": filename.decode("utf-8", "replace"),
        "content_type": part.headers.get(b"content-type", b"").decode("latin-1") or None,
        "size": part.size,
        "sha256": part.digest.hexdigest(),
    }

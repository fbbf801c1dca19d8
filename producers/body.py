"""Reading a delivery's body with limits: media type, size, JSON syntax and depth. Each
failure is an :class:`~keylane.routing.contract.errors.InvalidEvent` with its status (415,
413, 400).

The body is read straight from the ASGI ``receive`` channel (the webhook route is a raw
ASGI route, see :mod:`keylane.producers.receiver`). A refusal made before the whole body
has arrived first reads the rest and throws it away (:func:`discard_body`): most senders
write their whole body before they read the answer, and a server that answers and closes
while bytes are still coming in makes the kernel reset the connection, so the sender
would see a reset instead of the 413.

JSON is parsed by msgspec: it reads exactly what RFC 8259 allows, so ``NaN``,
``Infinity`` and numbers too large for a double (``1e400``) are not JSON to it (Python's
``json`` turns them into floats JSON cannot carry), integers keep every digit, and text
that is not UTF-8 or holds a lone surrogate is refused with the rest.
"""

from __future__ import annotations

import codecs
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

import msgspec

from ..routing.contract.errors import InvalidEvent

MAX_JSON_DEPTH = 32
#: The most of a refused body that is read and thrown away; a sender of more than this
#: gets its answer, then a closed connection.
DISCARD_MAX_BYTES = 32 << 20

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

_DECODE = msgspec.json.Decoder().decode


class ClientGone(Exception):
    """The sender closed the connection before its body was read."""


def check_media_type(headers: Mapping[str, str]) -> None:
    """415 unless the body is declared JSON (``application/json`` or ``*/*+json``)."""
    media = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        raise InvalidEvent(
            f"expected application/json, got {media or 'no content type'}",
            status=415,
            code="unsupported_media_type",
        )


async def read_body(headers: Mapping[str, str], receive: Receive, limit: int) -> bytes:
    """The body of a JSON delivery; 415 if it is not declared JSON, 413 as soon as it is
    over ``limit`` bytes (declared or streamed). A refused body is read to its end first;
    :class:`ClientGone` if the sender leaves before it has sent it."""
    try:
        check_media_type(headers)
    except InvalidEvent:
        await discard_body(headers, receive)
        raise
    declared = _declared_length(headers)
    if declared is not None and declared > limit:
        await discard_body(headers, receive)
        raise InvalidEvent(
            f"body of {declared} bytes is over the limit of {limit}", status=413, code="too_large"
        )
    message = await receive()
    body = _chunk(message)
    if not message.get("more_body", False):  # the whole body in one message: most deliveries
        return _within(body, limit)
    chunks = [body]
    size = len(body)
    while message.get("more_body", False):
        message = await receive()
        chunk = _chunk(message)
        size += len(chunk)
        if size > limit:
            await _discard(receive, message, DISCARD_MAX_BYTES - size)
            raise InvalidEvent(
                f"body is over the limit of {limit} bytes", status=413, code="too_large"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _chunk(message: Mapping[str, Any]) -> bytes:
    if message["type"] != "http.request":
        raise ClientGone()
    chunk: bytes = message.get("body", b"")
    return chunk


def _within(body: bytes, limit: int) -> bytes:
    if len(body) > limit:
        raise InvalidEvent(f"body is over the limit of {limit} bytes", status=413, code="too_large")
    return body


async def discard_body(headers: Mapping[str, str], receive: Receive) -> None:
    """Read the body that is still coming and throw it away (up to ``DISCARD_MAX_BYTES``),
    so that the sender reads the answer to a delivery refused before its body was read."""
    declared = _declared_length(headers)
    if declared is not None and declared > DISCARD_MAX_BYTES:
        return  # not worth reading: the sender gets the answer, then a closed connection
    await _discard(receive, {"more_body": True}, DISCARD_MAX_BYTES)


async def _discard(receive: Receive, last: Mapping[str, Any], budget: int) -> None:
    message = last
    while message.get("more_body", False) and budget >= 0:
        message = await receive()
        if message["type"] != "http.request":
            return
        budget -= len(message.get("body", b""))


def _declared_length(headers: Mapping[str, str]) -> int | None:
    declared = headers.get("content-length")
    return int(declared) if declared is not None and declared.isdigit() else None


def parse_json(body: bytes) -> Any:
    """The parsed body, or 400: not JSON (``malformed_json``, non-finite numbers
    included), or nested deeper than ``MAX_JSON_DEPTH`` (``too_deep``)."""
    text = body[3:] if body.startswith(codecs.BOM_UTF8) else body  # a BOM is no JSON
    try:
        payload = _DECODE(text)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidEvent(f"body is not valid JSON: {exc}", code="malformed_json") from None
    except RecursionError:
        raise InvalidEvent(
            f"JSON nested deeper than {MAX_JSON_DEPTH} levels", code="too_deep"
        ) from None
    # Nesting needs an opening bracket per level: a body with fewer of them than the
    # limit (counted in C, strings included) cannot be too deep, and needs no walk.
    openers = body.count(b"[") + body.count(b"{")
    if openers >= MAX_JSON_DEPTH and _deeper_than(payload, MAX_JSON_DEPTH):
        raise InvalidEvent(f"JSON nested deeper than {MAX_JSON_DEPTH} levels", code="too_deep")
    return payload


def _deeper_than(value: Any, limit: int) -> bool:
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

"""Reading a delivery's body with limits: its format (by media type, or the source's own),
and its size. Each failure is an :class:`~keylane.routing.contract.errors.InvalidEvent`
with its status (415, 413); the body's syntax is read by :mod:`.formats`.

The body is read straight from the ASGI ``receive`` channel (the webhook route is a raw
ASGI route, see :mod:`keylane.producers.receiver`). A refusal made before the whole body
has arrived first reads the rest and throws it away (:func:`discard_body`): most senders
write their whole body before they read the answer, and a server that answers and closes
while bytes are still coming in makes the kernel reset the connection, so the sender
would see a reset instead of the 413.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from ..routing.contract.errors import InvalidEvent
from .formats import format_of

#: The most of a refused body that is read and thrown away; a sender of more than this
#: gets its answer, then a closed connection.
DISCARD_MAX_BYTES = 32 << 20

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class ClientGone(Exception):
    """The sender closed the connection before its body was read."""


async def read_body(
    headers: Mapping[str, str], receive: Receive, limit: int, source_format: str = "auto"
) -> tuple[str, bytes]:
    """The format (:func:`~keylane.producers.formats.format_of`: the source's
    own, ``source_format``, else by media type; 415 for one keylane does not read) and the
    bytes of a delivery's body; 413 as soon as it is over ``limit`` bytes (declared or
    streamed). A refused body is read to its end first; :class:`ClientGone` if the sender
    leaves before it has sent it."""
    try:
        form = format_of(headers.get("content-type", ""), source_format)
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
        return form, _within(body, limit)
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
    return form, b"".join(chunks)


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

"""Reading a delivery's body with limits: media type, size, JSON depth. Each failure is an
:class:`~keylane.routing.contract.errors.InvalidEvent` with its status (415, 413, 400).

A refusal made before the whole body has arrived first reads the rest and throws it away
(:func:`discard_body`): most senders write their whole body before they read the answer,
and a server that answers and closes while bytes are still coming in makes the kernel
reset the connection, so the sender would see a reset instead of the 413.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import ClientDisconnect, Request

from ..routing.contract.errors import InvalidEvent

MAX_JSON_DEPTH = 32
#: The most of a refused body that is read and thrown away; a sender of more than this
#: gets its answer, then a closed connection.
DISCARD_MAX_BYTES = 32 << 20


def check_media_type(request: Request) -> None:
    """415 unless the body is declared JSON (``application/json`` or ``*/*+json``)."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        raise InvalidEvent(
            f"expected application/json, got {media or 'no content type'}",
            status=415,
            code="unsupported_media_type",
        )


async def read_body(request: Request, limit: int) -> bytes:
    """The body of a JSON delivery; 415 if it is not declared JSON, 413 as soon as it is
    over ``limit`` bytes (declared or streamed). A refused body is read to its end first."""
    try:
        check_media_type(request)
    except InvalidEvent:
        await discard_body(request)
        raise
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        await discard_body(request)
        raise InvalidEvent(
            f"body of {declared} bytes is over the limit of {limit}", status=413, code="too_large"
        )
    chunks: list[bytes] = []
    size = 0
    stream = request.stream()
    async for chunk in stream:
        size += len(chunk)
        if size > limit:
            await _discard(stream, DISCARD_MAX_BYTES - size)
            raise InvalidEvent(
                f"body is over the limit of {limit} bytes", status=413, code="too_large"
            )
        chunks.append(chunk)
    return b"".join(chunks)


async def discard_body(request: Request) -> None:
    """Read the body that is still coming and throw it away (up to ``DISCARD_MAX_BYTES``),
    so that the sender reads the answer to a delivery refused before its body was read."""
    declared = _declared_length(request)
    if declared is not None and declared > DISCARD_MAX_BYTES:
        return  # not worth reading: the sender gets the answer, then a closed connection
    await _discard(request.stream(), DISCARD_MAX_BYTES)


async def _discard(stream: AsyncIterator[bytes], budget: int) -> None:
    try:
        async for chunk in stream:
            budget -= len(chunk)
            if budget < 0:
                return
    except ClientDisconnect:
        return


def _declared_length(request: Request) -> int | None:
    declared = request.headers.get("content-length")
    return int(declared) if declared is not None and declared.isdigit() else None


def parse_json(body: bytes) -> Any:
    """The parsed body, or 400 (not JSON, or nested deeper than ``MAX_JSON_DEPTH``)."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise InvalidEvent(f"body is not valid JSON: {exc}", code="malformed_json") from None
    if _depth(payload) > MAX_JSON_DEPTH:
        raise InvalidEvent(f"JSON nested deeper than {MAX_JSON_DEPTH} levels", code="too_deep")
    return payload


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_JSON_DEPTH:
            break
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest

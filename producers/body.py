"""Reading a delivery's body with limits: media type, size, JSON depth. Each failure is an
:class:`~keylane.routing.contract.errors.InvalidEvent` with its status (415, 413, 400)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from keylane.routing.contract.errors import InvalidEvent

MAX_JSON_DEPTH = 32


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
    """The body, or 413 as soon as it is over ``limit`` bytes (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise InvalidEvent(
            f"body of {declared} bytes is over the limit of {limit}", status=413, code="too_large"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise InvalidEvent(
                f"body is over the limit of {limit} bytes", status=413, code="too_large"
            )
        chunks.append(chunk)
    return b"".join(chunks)


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

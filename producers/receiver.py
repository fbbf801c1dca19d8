"""The webhook receiver: ``POST /webhooks/{source}``, ``GET /healthz``, ``GET /readyz``.

The receiver is thin on purpose: it checks, dedupes and enqueues, and never touches the
record store. Its answers (the external contract, README "Receiver answers"):

* 202 accepted, with event id, record key and shard (and ``key_missing`` when the sender
  gave no event id); 200 ``ignored`` when the source maps nothing for the event type;
* 200 duplicate, replaying the first delivery's answer (``Keylane-Replayed: true``);
* 400 malformed or invalid, 401 bad signature, 404 unknown source, 409 same id with a
  different body
  (queued for review), 413 too large, 415 not JSON;
* 503 with ``Retry-After`` when the shard is over its high-water mark or Redis is down.

No 2xx is sent before Redis has run the accept script (:mod:`producers.enqueue`); no
4xx changes any state.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import redis.asyncio as aioredis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from producers.enqueue import Enqueuer
from producers.intake import Ignored, Intake, take_in
from producers.sources import SourceConfig, Sources, load_sources
from workers.errors import BrokerUnavailable, InvalidEvent, SignatureError
from workers.events import Event
from workers.faults import Faults
from workers.message import build_apply_message
from workers.settings import Settings

log = logging.getLogger("keylane.receiver")

MAX_JSON_DEPTH = 32
BROKER_DOWN_RETRY_AFTER_S = 5
FULL_RETRY_AFTER_S = 2


class Receiver:
    """The receiver's state: settings, sources and their verifiers, the accept script."""

    def __init__(
        self,
        settings: Settings,
        sources: Sources,
        enqueuer: Enqueuer,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.sources = sources
        self.enqueuer = enqueuer
        self.faults = Faults(settings.faults)
        self.verifiers = sources.verifiers(os.environ if environ is None else environ)
        self.hooks = {s.name: s.load_hook() for s in sources.all()}
        for source in sources.all():
            if source.unsigned and source.name != "demo":
                log.warning(
                    "source %s accepts unsigned deliveries (verify.scheme = none)", source.name
                )

    async def webhook(self, request: Request) -> Response:
        """``POST /webhooks/{source}``."""
        name = request.path_params["source"]
        source = self.sources.get(name)
        if source is None:
            return _error(404, "unknown_source", f"no source named {name!r}")
        try:
            _check_media_type(request)
            body = await _read_body(request, self.settings.max_body_bytes)
            verified = self.verifiers[source.name].verify(request.headers, body, time.time())
            intake = take_in(
                source,
                verified,
                body,
                _parse_json(body),
                _lower(request.headers),
                self.hooks[source.name],
            )
        except SignatureError as exc:
            log.info("refused a delivery for %s: %s", source.name, exc)
            return _error(401, "bad_signature", str(exc))
        except InvalidEvent as exc:
            return _error(exc.status, exc.code, str(exc))
        if isinstance(intake, Ignored):
            return JSONResponse(
                {
                    "status": "ignored",
                    "source": source.name,
                    "event_type": intake.event_type,
                    "reason": intake.reason,
                }
            )
        return await self._accept(source, self._event(source, intake, body))

    def _event(self, source: SourceConfig, intake: Intake, body: bytes) -> Event:
        return Event(
            source=source.name,
            event_id=intake.event_id,
            event_type=intake.event_type,
            record_key=intake.record_key,
            changes=intake.changes,
            body_sha256=hashlib.sha256(body).hexdigest(),
            accepted_at=time.time(),
            shard=self.settings.shards.shard_for_key(intake.record_key),
            key_missing=intake.key_missing,
        )

    async def _accept(self, source: SourceConfig, event: Event) -> Response:
        queue = self.settings.shards.queue_name(event.shard)
        answer: dict[str, Any] = {
            "status": "accepted",
            "source": event.source,
            "event_id": event.event_id,
            "record_key": event.record_key,
            "shard": event.shard,
            "queue": queue,
        }
        if event.key_missing:
            answer["key_missing"] = True
        retention_ms = source.retention(self.settings) * 1000
        self.faults.hit("receiver.before_enqueue", event.record_key)
        try:
            result = await self.enqueuer.accept(
                source=event.source,
                event_id=event.event_id,
                body_sha256=event.body_sha256,
                queue=queue,
                shard=event.shard,
                message=build_apply_message(event, queue),
                answer=json.dumps(answer),
                retention_ms=retention_ms,
                high_water=self.settings.shard_high_water,
                key_missing=event.key_missing,
            )
            if result.verdict == "reused":
                review = event.model_copy(update={"review": "id_reused"})
                await self.enqueuer.record_reuse(
                    source=event.source,
                    event_id=event.event_id,
                    body_sha256=event.body_sha256,
                    queue=queue,
                    shard=event.shard,
                    message=build_apply_message(review, queue),
                    retention_ms=retention_ms,
                )
        except BrokerUnavailable as exc:
            log.error("cannot enqueue %s/%s: %s", event.source, event.event_id, exc)
            return _error(
                503,
                "broker_unavailable",
                "cannot enqueue now; retry later",
                retry_after=BROKER_DOWN_RETRY_AFTER_S,
            )
        self.faults.hit("receiver.after_enqueue", event.record_key)
        return _answer(result.verdict, result.detail, event)

    async def healthz(self, request: Request) -> Response:
        """Liveness: the process answers."""
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """Readiness: Redis answers, so deliveries can be accepted."""
        if await self.enqueuer.ping():
            return JSONResponse({"status": "ready"})
        return _error(
            503,
            "broker_unavailable",
            "Redis does not answer",
            retry_after=BROKER_DOWN_RETRY_AFTER_S,
        )


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def _answer(verdict: str, detail: str, event: Event) -> Response:
    if verdict == "accepted":
        return Response(detail, status_code=202, media_type="application/json")
    if verdict == "duplicate":
        return Response(
            detail,
            status_code=200,
            media_type="application/json",
            headers={"Keylane-Replayed": "true"},
        )
    if verdict == "reused":
        return _error(
            409,
            "id_reused",
            f"event id {event.event_id!r} was already delivered with a different body; "
            "this delivery was recorded for review and not applied",
        )
    return _error(
        503,
        "shard_full",
        f"shard {event.shard} has {detail} events waiting; retry later",
        retry_after=FULL_RETRY_AFTER_S,
    )


def _check_media_type(request: Request) -> None:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        raise InvalidEvent(
            f"expected application/json, got {media or 'no content type'}",
            status=415,
            code="unsupported_media_type",
        )


async def _read_body(request: Request, limit: int) -> bytes:
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


def _parse_json(body: bytes) -> Any:
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


def _error(status: int, code: str, detail: str, retry_after: int | None = None) -> Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (no such route, wrong method) as JSON like every answer."""
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return _error(exc.status_code, code, str(exc.detail))


def create_receiver(
    settings: Settings,
    sources: Sources | None = None,
    environ: Mapping[str, str] | None = None,
) -> Starlette:
    """The receiver's ASGI application for ``settings`` (signing secrets are read from
    ``environ``, by default the process environment)."""
    client = aioredis.Redis.from_url(
        settings.redis_dsn(), socket_timeout=5, socket_connect_timeout=5, health_check_interval=15
    )
    receiver = Receiver(
        settings, sources or load_sources(settings), Enqueuer(client, settings.keys), environ
    )
    app = Starlette(
        exception_handlers={HTTPException: _http_error},
        routes=[
            Route("/webhooks/{source}", receiver.webhook, methods=["POST"]),
            Route("/healthz", receiver.healthz, methods=["GET"]),
            Route("/readyz", receiver.readyz, methods=["GET"]),
        ],
    )
    app.state.receiver = receiver
    return app

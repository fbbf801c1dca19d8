"""The webhook receiver: ``POST /webhooks/{source}``, ``GET /healthz``, ``GET /readyz``,
``GET /metrics``.

The receiver is thin on purpose: it checks, dedupes and enqueues, and never touches the
record store. Its answers (the external contract, README "The external contract"):

* 202 accepted, with event id, record key and shard (and ``key_missing`` when the sender
  gave no event id); 200 ``ignored`` when the source maps nothing for the event type;
* 200 duplicate, replaying the first delivery's answer (``Keylane-Replayed: true``);
* 400 malformed or invalid, 401 bad signature, 404 unknown source, 409 same id with a
  different body (queued for review), 413 too large, 415 not JSON;
* 503 with ``Retry-After`` when the shard or all shards together are over their
  high-water mark (derived from how fast they drain), or Redis is down.

No 2xx is sent before Redis has run the accept script (:mod:`keylane.producers.gateway`); no
4xx changes any state; a refusal never marks the event as seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping

import sentry_sdk
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..routing.contract.errors import BrokerUnavailable, InvalidEvent, SignatureError
from ..routing.contract.events import Event
from ..routing.contract.faults import Faults
from ..routing.contract.logcontext import event_context
from ..routing.contract.settings import Settings
from ..routing.contract.sources import SourceConfig, Sources, load_sources
from .body import discard_body, parse_json, read_body
from .gateway import EnqueueResult, ReceiverGateway, accepted_answer
from .intake import Ignored, Intake, load_hook, take_in
from .queue_watch import QueueWatch, ReceiverMetrics
from .signatures import verifiers_of

log = logging.getLogger("keylane.receiver")

BROKER_DOWN_RETRY_AFTER_S = 5
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class Receiver:
    """The receiver's state: settings, sources and their verifiers, the accept script,
    the queue watch and the metrics."""

    def __init__(
        self,
        settings: Settings,
        sources: Sources,
        gateway: ReceiverGateway,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.sources = sources
        self.gateway = gateway
        self.watch = QueueWatch(gateway)
        self.metrics = ReceiverMetrics(self.watch, gateway)
        self.faults = Faults(settings.faults)
        self.verifiers = verifiers_of(sources, os.environ if environ is None else environ)
        self.hooks = {s.name: load_hook(s) for s in sources.all()}
        for source in sources.all():
            if source.unsigned and source.name != "demo":
                log.warning(
                    "source %s accepts unsigned deliveries (verify.scheme = none)", source.name
                )

    # -- routes ---------------------------------------------------------------------------

    async def webhook(self, request: Request) -> Response:
        """``POST /webhooks/{source}``."""
        name = request.path_params["source"]
        source = self.sources.get(name)
        if source is None:
            await discard_body(request)
            return self.refuse(404, "unknown_source", f"no source named {name!r}")
        try:
            body = await read_body(request, self.settings.max_body_bytes)
            verified = self.verifiers[source.name].verify(request.headers, body, time.time())
            headers = {k.lower(): v for k, v in request.headers.items()}
            intake = take_in(
                source, verified, body, parse_json(body), headers, self.hooks[source.name]
            )
        except SignatureError as exc:
            log.info("refused a delivery for %s: %s", source.name, exc)
            return self.refuse(401, "bad_signature", str(exc))
        except InvalidEvent as exc:
            return self.refuse(exc.status, exc.code, str(exc))
        if isinstance(intake, Ignored):
            return JSONResponse(
                {
                    "status": "ignored",
                    "source": source.name,
                    "event_type": intake.event_type,
                    "reason": intake.reason,
                }
            )
        event = self._event(source, intake, body)
        with event_context(
            source=event.source,
            event_id=event.event_id,
            record_key=event.record_key,
            shard=event.shard,
        ):
            try:
                return await self._accept(source, event)
            except Exception as exc:
                # Captured here, with the event's tags; the web integration's own capture
                # of the same exception is then dropped as a duplicate.
                sentry_sdk.capture_exception(exc)
                raise

    async def healthz(self, request: Request) -> Response:
        """Liveness: the process answers."""
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """Readiness: Redis answers, so deliveries can be accepted."""
        if await self.gateway.ping():
            return JSONResponse({"status": "ready"})
        return self.refuse(
            503,
            "broker_unavailable",
            "Redis does not answer",
            retry_after=BROKER_DOWN_RETRY_AFTER_S,
        )

    async def prometheus(self, request: Request) -> Response:
        """``GET /metrics``: Prometheus text exposition."""
        try:
            text = await self.metrics.render()
        except Exception as exc:  # a scrape must say why it failed, not hang or 500 opaquely
            return self.refuse(
                503,
                "broker_unavailable",
                f"cannot read metrics: {exc}",
                retry_after=BROKER_DOWN_RETRY_AFTER_S,
            )
        return Response(text, media_type=PROMETHEUS_TEXT)

    # -- accepting --------------------------------------------------------------------------

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
            destination=source.destination_name,
            payload=intake.payload,
        )

    async def _accept(self, source: SourceConfig, event: Event) -> Response:
        s = self.settings
        if self.watch.total_depth >= s.global_high_water:
            return self.refuse(
                503,
                "overloaded",
                f"{self.watch.total_depth} events are waiting over all shards; retry later",
                retry_after=self.watch.retry_after_global(s.global_high_water),
            )
        queue = s.shards.queue_name(event.shard)
        answer = accepted_answer(event, queue)
        retention_ms = source.retention(s) * 1000
        self.faults.hit("receiver.before_enqueue", event.record_key)
        try:
            result = await self.gateway.accept_event(
                event,
                queue,
                json.dumps(answer),
                retention_ms,
                s.shard_high_water,
                source.batch_limit(s),
            )
            if result.verdict == "reused":
                await self.gateway.record_reuse(event, queue, retention_ms)
        except BrokerUnavailable as exc:
            log.error("cannot enqueue: %s", exc)
            return self.refuse(
                503,
                "broker_unavailable",
                "cannot enqueue now; retry later",
                retry_after=BROKER_DOWN_RETRY_AFTER_S,
            )
        self.faults.hit("receiver.after_enqueue", event.record_key)
        return self._answer(result, event)

    def _answer(self, result: EnqueueResult, event: Event) -> Response:
        if result.verdict == "accepted":
            return Response(result.detail, status_code=202, media_type="application/json")
        if result.verdict == "duplicate":
            return Response(
                result.detail,
                status_code=200,
                media_type="application/json",
                headers={"Keylane-Replayed": "true"},
            )
        if result.verdict == "reused":
            return self.refuse(
                409,
                "id_reused",
                f"event id {event.event_id!r} was already delivered with a different body; "
                "this delivery was recorded for review and not applied",
            )
        return self.refuse(
            503,
            "shard_full",
            f"shard {event.shard} has {result.detail} events waiting; retry later",
            retry_after=self.watch.retry_after(
                event.shard, int(result.detail), self.settings.shard_high_water
            ),
        )

    def refuse(
        self, status: int, code: str, detail: str, retry_after: int | None = None
    ) -> Response:
        """An error answer (JSON ``{"error", "detail"}``), counted by reason."""
        self.metrics.refused.labels(code).inc()
        return error_response(status, code, detail, retry_after)


def error_response(status: int, code: str, detail: str, retry_after: int | None = None) -> Response:
    """keylane's error body, with ``Retry-After`` when the sender should come back."""
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


def create_receiver(
    settings: Settings,
    sources: Sources | None = None,
    environ: Mapping[str, str] | None = None,
) -> Starlette:
    """The receiver's ASGI application for ``settings`` (signing secrets are read from
    ``environ``, by default the process environment)."""
    gateway = ReceiverGateway.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    receiver = Receiver(settings, sources or load_sources(settings), gateway, environ)

    async def http_error(request: Request, exc: Exception) -> Response:
        # Starlette's own 404/405 (no such route, wrong method), as JSON like every answer.
        assert isinstance(exc, HTTPException)
        await discard_body(request)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return receiver.refuse(exc.status_code, code, str(exc.detail))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        watcher = asyncio.create_task(receiver.watch.run())
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await gateway.close()

    app = Starlette(
        exception_handlers={HTTPException: http_error},
        lifespan=lifespan,
        routes=[
            Route("/webhooks/{source}", receiver.webhook, methods=["POST"]),
            Route("/healthz", receiver.healthz, methods=["GET"]),
            Route("/readyz", receiver.readyz, methods=["GET"]),
            Route("/metrics", receiver.prometheus, methods=["GET"]),
        ],
    )
    app.state.receiver = receiver
    return app

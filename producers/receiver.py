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

``POST /webhooks/{source}`` is a raw ASGI route (:class:`ReceiverApp`): it reads the body
from the ASGI channel and sends its answer as two ASGI messages, because Starlette's
routing, middleware, request and response objects cost more per delivery than the rest
of the receiver's own work (README "Benchmarks"). Everything else (``/healthz``,
``/readyz``, ``/metrics``, 404, 405, the lifespan) is a Starlette app behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    MutableMapping,
)
from typing import Any

import msgspec
import sentry_sdk
from sentry_sdk.types import Event as SentryEvent
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..routing.contract.errors import BrokerUnavailable, InvalidEvent, SignatureError
from ..routing.contract.faults import Faults
from ..routing.contract.logcontext import event_context
from ..routing.contract.outcomes import http_status_of, outcome_path, preferred_wait_s
from ..routing.contract.settings import Settings
from ..routing.contract.sources import SourceConfig, Sources, load_sources
from .accept import Acceptor, NewEvent, body_sha256, new_event
from .body import ClientGone, Receive, discard_body, parse_json, read_body
from .broker import EventQueue, open_event_queue
from .faults import crash
from .gateway import EnqueueResult
from .intake import Ignored, Intake, load_hook, take_in
from .outcome_reads import OUTCOME_ROUTE, OutcomeReads, source_tokens
from .outcome_waits import OutcomeWaits
from .queue_watch import QueueWatch, ReceiverMetrics
from .signatures import verifiers_of

log = logging.getLogger("keylane.receiver")

BROKER_DOWN_RETRY_AFTER_S = 5
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
WEBHOOK_PREFIX = "/webhooks/"

Scope = MutableMapping[str, Any]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_ENCODE = msgspec.json.Encoder().encode
_JSON_HEADERS = [(b"content-type", b"application/json")]
_REPLAYED = (b"keylane-replayed", b"true")


class Answer:
    """An HTTP answer: status, JSON body and extra headers."""

    __slots__ = ("body", "headers", "status", "told")

    def __init__(
        self, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self.status = status
        self.body = body
        self.headers = headers or []
        #: Whether the body is a told outcome (``routing/contract/outcomes.py``).
        self.told = False

    async def send(self, send: Send) -> None:
        """Send it on an ASGI channel."""
        headers = [*_JSON_HEADERS, (b"content-length", b"%d" % len(self.body)), *self.headers]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})

    def response(self) -> Response:
        """The same answer as a Starlette response (for the routes Starlette serves)."""
        headers = {k.decode(): v.decode() for k, v in self.headers}
        return Response(self.body, self.status, headers, media_type="application/json")


class Receiver:
    """The receiver's state: settings, sources and their verifiers, the accept path,
    the queue watch and the metrics."""

    def __init__(
        self,
        settings: Settings,
        sources: Sources,
        queue: EventQueue,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.sources = sources
        self.queue = queue
        self.acceptor = Acceptor(settings, queue)
        environ = os.environ if environ is None else environ
        self.waits = OutcomeWaits(queue.redis.outcome_feed)
        tokens = source_tokens(sources, environ)
        self.outcomes = OutcomeReads(settings, queue.redis, self.waits, tokens)
        self.watch = QueueWatch(queue.redis)
        self.metrics = ReceiverMetrics(self.watch, queue.redis)
        self.faults = Faults(settings.faults, crash)
        self.verifiers = verifiers_of(sources, environ)
        self.hooks = {s.name: load_hook(s) for s in sources.all()}
        self._keyless_seen: set[str] = set()
        built_in = settings.sources_file is None
        for source in sources.all():
            for warning in source.start_up_warnings(built_in):
                log.warning("%s", warning)

    # -- routes ---------------------------------------------------------------------------

    async def webhook(self, name: str, headers: dict[str, str], receive: Receive) -> Answer:
        """``POST /webhooks/{source}``: the answer to one delivery."""
        source = self.sources.get(name)
        if source is None:
            await discard_body(headers, receive)
            return self.refuse(404, "unknown_source", f"no source named {name!r}")
        try:
            body = await read_body(headers, receive, self.settings.max_body_bytes)
            verified = self.verifiers[source.name].verify(headers, body, time.time())
            intake = take_in(
                source, verified, body, parse_json(body), headers, self.hooks[source.name]
            )
            if isinstance(intake, Ignored):
                return self._ignored(source, intake)
            if intake.key_missing and source.name not in self._keyless_seen:
                self._warn_keyless(source)
            event = self._event(source, intake, body)
        except SignatureError as exc:
            log.info("refused a delivery for %s: %s", source.name, exc)
            return self.refuse(401, "bad_signature", str(exc))
        except InvalidEvent as exc:
            return self.refuse(exc.status, exc.code, str(exc))
        with event_context(
            source=event.source,
            event_id=event.event_id,
            record_key=event.record_key,
            shard=event.shard,
        ):
            try:
                wait_s = preferred_wait_s(headers.get("prefer"))
                if wait_s is None:
                    return await self._accept(source, event)
                return await self._accept_waiting(source, event, wait_s)
            except Exception as exc:
                sentry_sdk.capture_exception(exc)  # here, with the event's tags
                raise

    async def healthz(self, request: Request) -> Response:
        """Liveness: the process answers."""
        return Response(b'{"status":"ok"}', media_type="application/json")

    async def readyz(self, request: Request) -> Response:
        """Readiness: Redis answers, so deliveries can be accepted."""
        if await self.queue.ping():
            return Response(b'{"status":"ready"}', media_type="application/json")
        return self.refuse(
            503,
            "broker_unavailable",
            "Redis does not answer",
            retry_after=BROKER_DOWN_RETRY_AFTER_S,
        ).response()

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
            ).response()
        return Response(text, media_type=PROMETHEUS_TEXT)

    # -- accepting --------------------------------------------------------------------------

    def _warn_keyless(self, source: SourceConfig) -> None:
        # Once per source and process: keyless deliveries are counted (`keylane status`),
        # but the first one is also said out loud, since its sender's retries will run again.
        self._keyless_seen.add(source.name)
        log.warning(
            "source %s: a delivery had no event id at %s and was accepted as keyless; a "
            "retry of it will be applied again (counted as keyless in keylane status)",
            source.name,
            source.event_id_rule,
        )

    def _ignored(self, source: SourceConfig, intake: Ignored) -> Answer:
        body = {
            "status": "ignored",
            "source": source.name,
            "event_type": intake.event_type,
            "reason": intake.reason,
        }
        return Answer(200, _ENCODE(body))

    def _event(self, source: SourceConfig, intake: Intake, body: bytes) -> NewEvent:
        # A task or destination gets the body as it came (an HTTP forward sends these
        # very bytes); keylane's own records need only the changes.
        text = body.decode() if source.forwards else None
        return new_event(
            self.settings.shards,
            source=source.name,
            event_id=intake.event_id,
            event_type=intake.event_type,
            record_key=intake.record_key,
            changes=intake.changes,
            body_sha256=body_sha256(body),
            key_missing=intake.key_missing,
            destination=source.destination_name,
            body=text,
            conditions=intake.conditions,
            if_revision=intake.if_revision,
            identities=intake.identities,
        )

    async def _accept(self, source: SourceConfig, event: NewEvent) -> Answer:
        s = self.settings
        if self.watch.total_depth >= s.global_high_water:
            return self.refuse(
                503,
                "overloaded",
                f"{self.watch.total_depth} events are waiting over all shards; retry later",
                retry_after=self.watch.retry_after_global(s.global_high_water),
            )
        retention_s = source.retention(s)
        self.faults.hit("receiver.before_enqueue", event.record_key)
        try:
            result = await self.acceptor.accept(event, retention_s, source.batch_limit(s))
            if result.verdict == "reused":
                await self.acceptor.record_reuse(event, retention_s)
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

    async def _accept_waiting(self, source: SourceConfig, event: NewEvent, wait_s: int) -> Answer:
        """:meth:`_accept` for a delivery that asks to wait ``wait_s`` for its outcome
        (``Prefer: wait``, capped by ``KEYLANE_OUTCOME_WAIT_MAX_S``): registered before
        the accept, so an outcome told after it is heard (see
        :mod:`keylane.producers.outcome_waits`)."""
        applied_s = min(wait_s, self.settings.outcome_wait_max_s)
        async with self.waits.waiting_for(event.source, event.event_id) as waiter:
            answer = await self._accept(source, event)
            if answer.status not in (200, 202) or answer.told:
                return answer
            told = await waiter.outcome(applied_s)
        return told_answer(told, answer, applied_s, event.source, event.event_id)

    def _answer(self, result: EnqueueResult, event: NewEvent) -> Answer:
        if result.verdict == "accepted":
            return Answer(202, result.detail.encode())
        if result.verdict == "duplicate" and result.told is not None:
            # Decided already: the stored outcome, not only the first 202.
            answer = Answer(http_status_of(result.told), result.told, [_REPLAYED])
            answer.told = True
            return answer
        if result.verdict == "duplicate":
            return Answer(200, result.detail.encode(), [_REPLAYED])
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

    def refuse(self, status: int, code: str, detail: str, retry_after: int | None = None) -> Answer:
        """An error answer (JSON ``{"error", "detail"}``), counted by reason."""
        self.metrics.refused.labels(code).inc()
        return error_answer(status, code, detail, retry_after)


def error_answer(status: int, code: str, detail: str, retry_after: int | None = None) -> Answer:
    """keylane's error body, with ``Retry-After`` when the sender should come back."""
    headers = [(b"retry-after", str(retry_after).encode())] if retry_after is not None else None
    return Answer(status, _ENCODE({"error": code, "detail": detail}), headers)


def told_answer(
    told: bytes | None, accepted: Answer, wait_s: int, source: str, event_id: str
) -> Answer:
    """The answer to a request that waited up to ``wait_s``: its told outcome, or (not
    known in time) the accept's answer as without waiting, with where to ask later."""
    applied = (b"preference-applied", b"wait=%d" % wait_s)
    if told is None:
        location = (b"location", outcome_path(source, event_id).encode())
        headers = [*accepted.headers, applied, location]
        return Answer(accepted.status, accepted.body, headers)
    answer = Answer(http_status_of(told), told, [*accepted.headers, applied])
    answer.told = True
    return answer


class ReceiverApp:
    """The receiver's ASGI application: ``POST /webhooks/{source}`` served here, every
    other request and the lifespan by ``fallback`` (Starlette)."""

    def __init__(self, receiver: Receiver, fallback: Starlette) -> None:
        self.receiver = receiver
        self.fallback = fallback
        self.state = fallback.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path: str = scope["path"]
            name = path[len(WEBHOOK_PREFIX) :]
            if path.startswith(WEBHOOK_PREFIX) and name and "/" not in name:
                await self._webhook(name, scope, receive, send)
                return
        await self.fallback(scope, receive, send)

    async def _webhook(self, name: str, scope: Scope, receive: Receive, send: Send) -> None:
        # Header names come lowercased from the server; the first of a repeated header
        # wins, as everywhere in keylane (``signatures.base.lower_headers``).
        headers: dict[str, str] = {}
        for key, value in scope["headers"]:
            headers.setdefault(key.decode("latin-1"), value.decode("latin-1"))
        if sentry_sdk.get_client().is_active():
            with _sentry_request(scope, headers):
                answer = await self._answer(name, headers, receive)
        else:
            answer = await self._answer(name, headers, receive)
        if answer is not None:
            await answer.send(send)

    async def _answer(self, name: str, headers: dict[str, str], receive: Receive) -> Answer | None:
        try:
            return await self.receiver.webhook(name, headers, receive)
        except ClientGone:
            return None  # the sender left before its body arrived: no one to answer
        except Exception as exc:
            log.error("error answering a delivery for %s", name, exc_info=exc)
            # Already captured with the event's tags when it came from accepting it:
            # Sentry then drops this second capture of the same exception.
            sentry_sdk.capture_exception(exc)
            return Answer(500, _ENCODE({"error": "internal", "detail": "internal error"}))


@contextlib.contextmanager
def _sentry_request(scope: Scope, headers: Mapping[str, str]) -> Iterator[None]:
    """A Sentry scope whose events say which request failed: its URL and method, nothing
    else of it (see :mod:`keylane.ops.observability`)."""
    url = f"{scope.get('scheme', 'http')}://{headers.get('host', '')}{scope['path']}"

    def add_request(event: SentryEvent, hint: dict[str, Any]) -> SentryEvent:
        event["request"] = {"url": url, "method": "POST"}
        return event

    with sentry_sdk.new_scope() as sentry_scope:
        sentry_scope.add_event_processor(add_request)
        yield


def create_receiver(
    settings: Settings,
    sources: Sources | None = None,
    environ: Mapping[str, str] | None = None,
) -> ReceiverApp:
    """The receiver's ASGI application for ``settings`` (signing secrets are read from
    ``environ``, by default the process environment)."""
    queue = open_event_queue(settings)
    receiver = Receiver(settings, sources or load_sources(settings), queue, environ)

    async def http_error(request: Request, exc: Exception) -> Response:
        # Starlette's own 404/405 (no such route, wrong method), as JSON like every answer.
        assert isinstance(exc, HTTPException)
        await discard_body(request.headers, request.receive)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return receiver.refuse(exc.status_code, code, str(exc.detail)).response()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Everything built so far (imports, settings, sources, the app) lives as long as
        # the process: out of the collector's sight, a full collection scans only what
        # requests made, in a fraction of the time (a tail-latency pause otherwise).
        gc.collect()
        gc.freeze()
        watcher = asyncio.create_task(receiver.watch.run())
        try:
            yield
        finally:
            receiver.watch.stop()
            await watcher
            await receiver.waits.close()
            await queue.close()

    async def webhook_elsewhere(request: Request) -> Response:
        # Only reached for what ReceiverApp does not serve: a method other than POST.
        raise HTTPException(405)

    app = Starlette(
        exception_handlers={HTTPException: http_error},
        lifespan=lifespan,
        routes=[
            Route("/webhooks/{source}", webhook_elsewhere, methods=["POST"]),
            Route("/healthz", receiver.healthz, methods=["GET"]),
            Route("/readyz", receiver.readyz, methods=["GET"]),
            Route("/metrics", receiver.prometheus, methods=["GET"]),
            Route(OUTCOME_ROUTE, receiver.outcomes.get, methods=["GET"]),
        ],
    )
    app.state.receiver = receiver
    return ReceiverApp(receiver, app)

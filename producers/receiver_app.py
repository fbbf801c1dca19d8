"""The receiver's ASGI application.

``POST /webhooks/{source}`` (and the ``GET`` of a sender's handshake there) is a raw ASGI
route (:class:`ReceiverApp`): it reads the body from the ASGI channel and sends its answer
as two ASGI messages, because Starlette's routing, middleware, request and response
objects cost more per delivery than the rest of the receiver's own work
(``ops/docs/benchmarks.md``). Everything else (``/healthz``, ``/readyz``, the outcome
routes, 404, 405, the lifespan) is a Starlette app behind it. ``/metrics`` is not here:
it is on the operations listener (``ops/operations.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, MutableMapping
from typing import Any

import sentry_sdk
from sentry_sdk.types import Event as SentryEvent
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..routing.contract.settings import Settings
from ..routing.contract.sources import Sources, load_sources
from .answers import Answer, Send, error_answer
from .body import ClientGone, Receive, discard_body
from .broker import open_event_queue
from .outcome_reads import OUTCOME_ROUTE
from .receiver import Receiver

log = logging.getLogger("keylane.receiver")

WEBHOOK_PREFIX = "/webhooks/"

Scope = MutableMapping[str, Any]


class ReceiverApp:
    """The receiver's ASGI application: ``/webhooks/{source}`` served here (``POST``, and
    a ``GET`` handshake), every other request and the lifespan by ``fallback``
    (Starlette)."""

    def __init__(self, receiver: Receiver, fallback: Starlette) -> None:
        self.receiver = receiver
        self.fallback = fallback
        self.state = fallback.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "GET"):
            path: str = scope["path"]
            name = path[len(WEBHOOK_PREFIX) :]
            if path.startswith(WEBHOOK_PREFIX) and name and "/" not in name:
                if scope["method"] == "POST":
                    await self._webhook(name, scope, receive, send)
                    return
                answer = await self.receiver.handshake_get(
                    name, _headers(scope), scope.get("query_string", b"")
                )
                if answer is not None:
                    await answer.send(send)
                    return
        await self.fallback(scope, receive, send)

    async def _webhook(self, name: str, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        if sentry_sdk.get_client().is_active():
            with _sentry_request(scope, headers):
                answer = await self._answer(name, scope, headers, receive)
        else:
            answer = await self._answer(name, scope, headers, receive)
        if answer is not None:
            await answer.send(send)

    async def _answer(
        self, name: str, scope: Scope, headers: dict[str, str], receive: Receive
    ) -> Answer | None:
        try:
            raw_path = scope.get("raw_path")
            path = raw_path.decode("latin-1") if raw_path else scope["path"]
            query = scope.get("query_string", b"")
            return await self.receiver.webhook(name, headers, receive, path, query)
        except ClientGone:
            return None  # the sender left before its body arrived: no one to answer
        except Exception as exc:
            log.error("error answering a delivery for %s", name, exc_info=exc)
            # Already captured with the event's tags when it came from accepting it:
            # Sentry then drops this second capture of the same exception.
            sentry_sdk.capture_exception(exc)
            return error_answer(500, "internal", "internal error")


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers by name. Names come lowercased from the server; the first of
    a repeated header wins, as everywhere in keylane (``signatures.verifier.lower_headers``)."""
    headers: dict[str, str] = {}
    for key, value in scope["headers"]:
        headers.setdefault(key.decode("latin-1"), value.decode("latin-1"))
    return headers


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
            await receiver.door.close()
            await queue.close()

    async def webhook_elsewhere(request: Request) -> Response:
        # Only reached for what ReceiverApp does not serve: another method, or a GET to a
        # source whose sender has no GET handshake.
        raise HTTPException(405)

    app = Starlette(
        exception_handlers={HTTPException: http_error},
        lifespan=lifespan,
        routes=[
            Route("/webhooks/{source}", webhook_elsewhere, methods=["POST"]),
            Route("/healthz", receiver.healthz, methods=["GET"]),
            Route("/readyz", receiver.readyz, methods=["GET"]),
            Route(OUTCOME_ROUTE, receiver.outcomes.get, methods=["GET"]),
        ],
    )
    app.state.receiver = receiver
    return ReceiverApp(receiver, app)

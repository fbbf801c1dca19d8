"""Bounds on the receiver's clients, below the ASGI app: how long a request's headers and
body may take to arrive, how large its headers may be, how many connections one receiver
holds (ops/docs/production.md, "What listens where").

uvicorn bounds only the idle time between two requests of a connection
(``timeout_keep_alive``). Its httptools protocol, the one ``uvicorn[standard]`` runs,
reads a request's headers for as long as they take and as large as they come (4 MiB of
one header was read whole here); ``h11_max_incomplete_event_size`` bounds only the h11
protocol, which keylane does not run; ``limit_concurrency`` counts the connections already
open too, so past it a request on a keep-alive connection that was served a moment ago
is refused as well. Hence :func:`bounded_protocol`: uvicorn's httptools protocol with

* a deadline per phase of a request: its line and headers within ``header_timeout_s`` of
  its first byte (of the connection, for a connection's first request), its body within
  ``body_timeout_s`` of its headers; past it the client is answered ``408`` and the
  connection closed. An idle keep-alive connection has no deadline of these (uvicorn's
  keep-alive timeout closes it);
* at most ``header_max_bytes`` of request line and headers, else ``431``, closed;
* at most ``max_connections`` connections served: a connection opened past it is answered
  ``503`` with ``Retry-After`` and ``Connection: close`` to its first request, while the
  connections already open are served as before.

Deadlines are checked by one timer per listener, every :data:`SWEEP_S`, not one timer per
request: a request costs two clock reads and a few attribute writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import msgspec
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..routing.contract.settings import Settings

#: How often a listener looks for requests past their deadline: a bound holds to within it.
SWEEP_S = 0.5
#: What a client refused for too many connections is told to wait.
FULL_RETRY_AFTER_S = 1

_IDLE, _HEADERS, _BODY = 0, 1, 2


@dataclass(frozen=True)
class ClientBounds:
    """The bounds of one listener, and what to call with each refusal's reason
    (``header_timeout``, ``headers_too_large``, ``body_timeout``, ``too_many_connections``)."""

    header_timeout_s: float
    header_max_bytes: int
    body_timeout_s: float
    max_connections: int
    on_refusal: Callable[[str], None] = lambda reason: None

    @classmethod
    def of(cls, settings: Settings, on_refusal: Callable[[str], None]) -> ClientBounds:
        """The receiver's bounds as ``settings`` set them."""
        return cls(
            settings.header_timeout_s,
            settings.header_max_bytes,
            settings.body_timeout_s,
            settings.max_connections,
            on_refusal,
        )


def _error_body(code: str, detail: str) -> bytes:
    return msgspec.json.encode({"error": code, "detail": detail})  # as every keylane error


def refusal(status: int, code: str, detail: str) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, with keylane's error body."""
    body = _error_body(code, detail)
    phrase = HTTPStatus(status).phrase.encode()
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (status, phrase, len(body), body)
    )


def bounded_protocol(bounds: ClientBounds) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol under ``bounds`` (give it to ``uvicorn.Config(http=)``);
    one class per listener: its connections are counted and swept together."""
    # Every connection leaves both in connection_lost (the listener runs no WebSocket
    # protocol that could take a connection over: ``uvicorn.Config(ws="none")``).
    admitted: set[BoundedHttp] = set()
    watched: set[BoundedHttp] = set()
    sweeping: list[asyncio.TimerHandle] = []
    full = _full_app(bounds)

    def sweep(loop: asyncio.AbstractEventLoop) -> None:
        sweeping.clear()
        now = loop.time()
        for connection in list(watched):
            if connection.deadline and now > connection.deadline:
                connection.expire()
        if watched:
            sweeping.append(loop.call_later(SWEEP_S, sweep, loop))

    class BoundedHttp(HttpToolsProtocol):
        """One connection of a bounded listener."""

        deadline = 0.0  # when the phase under way must be over (0: none)
        phase = _IDLE
        header_bytes = 0  # of the request's headers, in the reads before the last
        chunk_bytes = 0  # the last read

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(admitted) >= bounds.max_connections:
                self.app = full  # its first request is answered 503, then it closes
            else:
                admitted.add(self)
            watched.add(self)
            self._begin(_HEADERS, bounds.header_timeout_s)
            if not sweeping:
                sweeping.append(self.loop.call_later(SWEEP_S, sweep, self.loop))

        def connection_lost(self, exc: Exception | None) -> None:
            admitted.discard(self)
            watched.discard(self)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            self.chunk_bytes = len(data)
            super().data_received(data)
            if self.phase == _HEADERS and not self.transport.is_closing():
                # Headers still incomplete after this read: every byte of it was theirs.
                self.header_bytes += self.chunk_bytes
                if self.header_bytes > bounds.header_max_bytes:
                    self.cut(431, "headers_too_large", _too_large(bounds))

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self.phase == _IDLE:  # a keep-alive connection's next request
                self._begin(_HEADERS, bounds.header_timeout_s)

        def on_headers_complete(self) -> None:
            self._begin(_BODY, bounds.body_timeout_s)
            if self.header_bytes + self.chunk_bytes > bounds.header_max_bytes:
                size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
                if size > bounds.header_max_bytes:
                    # Complete, but too large: answered by an app of its own, as the
                    # parser goes on with this read (the body) after this call.
                    app, self.app = self.app, _answer_app(431, "headers_too_large", bounds)
                    try:
                        super().on_headers_complete()
                    finally:
                        self.app = app
                    return
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self.phase, self.deadline, self.header_bytes = _IDLE, 0.0, 0
            super().on_message_complete()

        def _begin(self, phase: int, timeout_s: float) -> None:
            self.phase, self.deadline = phase, self.loop.time() + timeout_s
            if phase == _HEADERS:
                self.header_bytes = 0

        def expire(self) -> None:
            """The phase under way took too long: answer 408 (unless an answer is
            already going out) and close. Not while this side stopped reading (a
            pipelined request waits for the one before it): its time starts again."""
            if self.flow.read_paused:
                phase_s = (
                    bounds.header_timeout_s if self.phase == _HEADERS else bounds.body_timeout_s
                )
                self.deadline = self.loop.time() + phase_s
            elif self.phase == _HEADERS:
                detail = f"request headers not received within {bounds.header_timeout_s:g}s"
                self.cut(408, "header_timeout", detail)
            elif self.phase == _BODY:
                detail = f"request body not received within {bounds.body_timeout_s:g}s"
                self.cut(408, "body_timeout", detail)

        def cut(self, status: int, code: str, detail: str) -> None:
            """Refuse the request under way and close the connection. A request whose
            app is reading the body hears a disconnect (it then answers nothing); one
            already answered (a 413 before its whole body came) is only closed."""
            answered = (
                self.phase == _BODY and self.cycle is not None and (self.cycle.response_started)
            )
            self.phase, self.deadline = _IDLE, 0.0
            if self.transport.is_closing():
                return
            if not answered:
                bounds.on_refusal(code)
                self.transport.write(refusal(status, code, detail))
            self.transport.close()

    return BoundedHttp


AsgiApp = Callable[[Any, Any, Any], Any]


def _answer_app(status: int, code: str, bounds: ClientBounds) -> AsgiApp:
    """An ASGI app that refuses every request with ``status`` and closes the connection."""
    if status == 503:
        detail = f"this receiver serves {bounds.max_connections} connections; retry later"
        retry_after: int | None = FULL_RETRY_AFTER_S
    else:
        detail, retry_after = _too_large(bounds), None
    body = _error_body(code, detail)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        (b"connection", b"close"),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", b"%d" % retry_after))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        bounds.on_refusal(code)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def _full_app(bounds: ClientBounds) -> AsgiApp:
    return _answer_app(503, "too_many_connections", bounds)


def _too_large(bounds: ClientBounds) -> str:
    return f"request line and headers over {bounds.header_max_bytes} bytes"

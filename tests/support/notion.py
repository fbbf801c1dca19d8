"""HTTP servers that stand in for the systems keylane writes to, written for the tests.

* :class:`NotionLike` — a CRM-style API like Notion's: query pages by email, create a
  page, append to a page. No unique constraint, and a random 5-50 ms delay on every call,
  so "search, then create" races exactly as it does against the real thing.
* :class:`HookServer` — a webhook endpoint (what an n8n or Zapier workflow exposes) that
  records every call with its time and ``Idempotency-Key``, applies each key's effect at
  most once when asked to honour keys, verifies Standard Webhooks signatures, and can
  answer 429 storms, refuse an event, hold a call until released, or be down.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.open_connections: set[socket.socket] = set()

    def process_request(self, request: Any, client_address: Any) -> None:
        self.open_connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.open_connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Cut every open connection (kept-alive ones too), as a server that dies does."""
        for conn in list(self.open_connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Base:
    """A threaded HTTP server on 127.0.0.1 that can stop and start on the same port."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.port = 0
        self._server: _Server | None = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: Any, headers: dict[str, str]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("content-length") or 0))

            def do_POST(self) -> None:
                status, body, headers = owner.handle("POST", self.path, self.headers, self._body())
                self._answer(status, body, headers)

            def do_PATCH(self) -> None:
                status, body, headers = owner.handle("PATCH", self.path, self.headers, self._body())
                self._answer(status, body, headers)

        return Handler

    def handle(
        self, method: str, path: str, headers: Any, body: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        raise NotImplementedError

    def start(self) -> _Base:
        """Listen (on the same port as before, after :meth:`stop`)."""
        self._server = _Server(("127.0.0.1", self.port), self._handler())
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening: new connections are refused."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server.drop_connections()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class NotionLike(_Base):
    """Pages with an email and a list of updates; see the module docstring."""

    def __init__(self, seed: int = 1) -> None:
        super().__init__()
        self.pages: dict[str, dict[str, Any]] = {}
        self._rng = random.Random(seed)

    def _delay(self) -> None:
        with self.lock:
            delay_s = self._rng.uniform(0.005, 0.05)
        time.sleep(delay_s)  # the API's own latency: what opens the race window

    def handle(
        self, method: str, path: str, headers: Any, body: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        self._delay()
        doc = json.loads(body or b"{}")
        with self.lock:
            if method == "POST" and path == "/v1/query":
                found = [p for p in self.pages.values() if p["email"] == doc["email"]]
                return 200, {"results": found}, {}
            if method == "POST" and path == "/v1/pages":
                page = {"id": f"page-{len(self.pages) + 1}", "email": doc["email"], "updates": []}
                page["updates"] += doc.get("updates", [])
                self.pages[page["id"]] = page
                return 200, page, {}
            if method == "PATCH" and path.startswith("/v1/pages/"):
                page = self.pages[path.rsplit("/", 1)[1]]
                page["updates"].append(doc["append"])
                return 200, page, {}
        return 404, {"error": "no such route"}, {}

    def pages_by_email(self) -> dict[str, list[dict[str, Any]]]:
        """Every page, grouped by email."""
        out: dict[str, list[dict[str, Any]]] = {}
        with self.lock:
            for page in self.pages.values():
                out.setdefault(page["email"], []).append(page)
        return out


@dataclass
class Call:
    """One call as the hook server saw it."""

    at: float
    key: str
    body: dict[str, Any]
    status: int


@dataclass
class HookServer(_Base):
    """A webhook endpoint; see the module docstring."""

    secret: str | None = None
    honour_keys: bool = True
    storm_s: float = 0.0  # answer 429 + Retry-After to every call this long after the first
    storm_until: float = 0.0
    storm_every: int = 0  # and to every n-th call after it (0: never)
    retry_after_s: int = 1
    refuse: set[str] = field(default_factory=set)  # event ids answered 422
    unavailable: set[str] = field(default_factory=set)  # record keys answered 503
    gate: threading.Event | None = None  # when set up, every call waits until it is set
    hold: dict[str, threading.Event] = field(default_factory=dict)  # key -> released
    calls: list[Call] = field(default_factory=list)
    status_counts: dict[int, int] = field(default_factory=dict)
    effects: dict[str, list[Any]] = field(default_factory=dict)  # record key -> effects
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)  # idempotency key -> body
    headers: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> last call's
    bodies: dict[str, bytes] = field(default_factory=dict)  # key -> last call's, as it came
    gather: int = 0  # hold every call until this many were in flight at once (at most 60 s)
    peak: int = 0  # the most calls in flight at once
    overlaps: int = 0  # calls that began while another call for the same record was open

    def __post_init__(self) -> None:
        super().__init__()
        self._open: dict[str, int] = {}  # record key -> calls in flight
        self._gathered = threading.Condition()

    def handle(
        self, method: str, path: str, headers: Any, body: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        record = headers.get("keylane-record-key") or ""
        with self._gathered:
            self._open[record] = self._open.get(record, 0) + 1
            self.overlaps += self._open[record] > 1
            self.peak = max(self.peak, sum(self._open.values()))
            self._gathered.notify_all()
            self._gathered.wait_for(lambda: self.peak >= self.gather, 60)
        try:
            return self._answer(headers, body)
        finally:
            with self._gathered:
                self._open[record] -= 1

    @property
    def in_flight(self) -> int:
        """Calls open right now."""
        with self._gathered:
            return sum(self._open.values())

    def _answer(self, headers: Any, body: bytes) -> tuple[int, Any, dict[str, str]]:
        key = headers.get("idempotency-key") or ""
        with self.lock:
            self.headers[key] = {k.lower(): v for k, v in headers.items()}
            self.bodies[key] = body
        if self.secret is not None:
            Webhook(self.secret).verify(body, dict(headers.items()))  # raises when wrong
        doc = json.loads(body)
        gate = self.hold.get(key) or self.gate
        if gate is not None:
            self._record(key, doc, 0)
            gate.wait(60)  # held until the test has killed (or paused) the worker that called
        record = headers.get("keylane-record-key") or ""
        if record in self.unavailable:
            with self.lock:
                self._record(key, doc, 503)
                self.status_counts[503] = self.status_counts.get(503, 0) + 1
            return 503, {"error": "unavailable"}, {}
        with self.lock:
            status = self._status(doc)
            self._record(key, doc, status)
            self.status_counts[status] = self.status_counts.get(status, 0) + 1
            if status != 200:
                headers_out = {"retry-after": str(self.retry_after_s)} if status == 429 else {}
                return status, {"error": "not now" if status == 429 else "refused"}, headers_out
            if key in self.answers and self.honour_keys:
                return 200, self.answers[key], {"idempotent-replayed": "true"}
            self.effects.setdefault(record, []).append(doc)
            self.answers[key] = {"ok": True, "effect": len(self.effects[record])}
            return 200, self.answers[key], {}

    def _status(self, doc: dict[str, Any]) -> int:
        if doc.get("id") in self.refuse:
            return 422
        if not self.calls and self.storm_s:
            self.storm_until = time.time() + self.storm_s
        if time.time() < self.storm_until:
            return 429
        n = sum(1 for c in self.calls if c.status)
        return 429 if self.storm_every and n % self.storm_every == 0 else 200

    def _record(self, key: str, doc: dict[str, Any], status: int) -> None:
        self.calls.append(Call(time.time(), key, doc, status))

    def max_calls_in_window(self, window_s: float = 1.0) -> int:
        """The most calls that arrived within any ``window_s`` (held calls not counted twice)."""
        times = sorted(c.at for c in self.calls if c.status)
        best, start = 0, 0
        for end, t in enumerate(times):
            while t - times[start] >= window_s:
                start += 1
            best = max(best, end - start + 1)
        return best

"""The benchmarks' load generator (:func:`keylane.ops.bench.load.run_load`): every body
POSTed once per attempt, on kept-alive connections, a 503 or a dropped connection retried
with the same body, and each body's span recorded, against a real HTTP/1.1 server and a
real receiver."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from keylane.ops.bench.load import run_load
from tests.support.stack import Stack


class _Flaky(BaseHTTPRequestHandler):
    """Answers 202, except: a body's first try with ``"flaky"`` in it gets 503, and every
    7th request is answered with ``connection: close``, every 11th not at all."""

    protocol_version = "HTTP/1.1"
    lock = threading.Lock()
    seen: Counter[bytes]
    peers: set[tuple[str, int]]
    requests = 0

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        with self.lock:
            type(self).requests += 1
            number = type(self).requests
            self.seen[body] += 1
            tries = self.seen[body]
            self.peers.add(self.client_address)
        if number % 11 == 0:
            self.close_connection = True  # no answer: the sender sees the connection end
            return
        status = 503 if b"flaky" in body and tries == 1 else 202
        answer = json.dumps({"status": status}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        if number % 7 == 0:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def flaky() -> Iterator[type[_Flaky]]:
    handler: type[_Flaky] = type("Handler", (_Flaky,), {"seen": Counter(), "peers": set()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.url = f"http://127.0.0.1:{server.server_address[1]}/webhooks/demo"  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


def test_every_body_is_answered_once_retried_with_the_same_bytes_on_kept_alive_connections(
    flaky: type[_Flaky],
) -> None:
    # Given 300 bodies, a tenth of which the server refuses once with 503, a server that
    # closes some connections after answering and drops others unanswered
    bodies = [
        json.dumps({"id": f"evt_{n}", "kind": "flaky" if n % 10 == 0 else "plain"}).encode()
        for n in range(300)
    ]
    # When 8 senders POST them all, retrying as a sender does
    load = run_load(flaky.url, bodies, 8, retry=True)  # type: ignore[attr-defined]
    # Then each body got its 202 and a span, the refused and the dropped ones after a retry
    assert load.statuses == Counter({202: 300})
    assert load.transport_errors == 0
    assert all(span is not None and span[0] <= span[1] for span in load.spans)
    assert set(flaky.seen) == set(bodies)
    assert sum(flaky.seen.values()) == flaky.requests == 300 + load.retries
    assert all(flaky.seen[body] >= 2 for body in bodies if b"flaky" in body)
    # And the connections were kept alive between answers: far fewer than the requests
    assert len(flaky.peers) < flaky.requests / 3
    assert load.percentile_ms(99) >= load.percentile_ms(50) > 0


def test_a_body_that_never_gets_through_is_a_transport_error_not_an_answer() -> None:
    # Given nothing listening on the port
    with ThreadingHTTPServer(("127.0.0.1", 0), _Flaky) as closed:
        port = closed.server_address[1]
    # When one body is sent without retries
    load = run_load(f"http://127.0.0.1:{port}/webhooks/demo", [b"{}"], 1)
    # Then it is counted as a transport error, with no status and no span
    assert load.transport_errors == 1
    assert not load.statuses
    assert load.spans == [None]


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_load_reads_the_receivers_answers(stack: Stack) -> None:
    # Given a receiver
    stack.receiver()
    bodies = [
        json.dumps(
            {
                "id": f"evt_{n % 40}",
                "type": "t",
                "record_key": f"c:{n % 5}",
                "changes": {"n": {"increment": 1}},
            }
        ).encode()
        for n in range(80)
    ]
    # When 80 deliveries of 40 events are POSTed by 4 senders
    load = run_load(f"{stack.url}/webhooks/demo", bodies, 4, retry=True)
    # Then 40 were accepted and the 40 repeats answered as duplicates, none lost
    assert load.statuses[202] + load.statuses[200] == 80
    assert load.statuses[202] == 40

"""The receiver's bounds on its clients, from outside, with real sockets against a real
``keylane serve``: headers within a time and a size, the body within a time, at most N
connections; and the port that faces the internet serves no ``/metrics`` (the
operations listener does)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.support.stack import Stack, event, wait_until

SQLITE = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
pytestmark = SQLITE  # the receiver never touches the store: one kind is enough


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


@contextmanager
def _connection(url: str) -> Iterator[socket.socket]:
    sock = socket.create_connection(_address(url), timeout=30)
    try:
        yield sock
    finally:
        sock.close()


def _request(body: bytes, path: str = "/webhooks/demo") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP answer read from ``sock``: status, headers, body (by content-length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before an answer: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split()[1]), headers, rest[:length]


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (EOF or reset within a few seconds)."""
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _body(event_id: str) -> bytes:
    return json.dumps(event(event_id, f"contact:{event_id}", visits={"increment": 1})).encode()


def _refused(stack: Stack, reason: str) -> float:
    text = httpx.get(f"{stack.ops_url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'keylane_refused_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


class Steady:
    """A sender posting a new event every 0.1 s on its own connections, while a test
    misbehaves beside it: every answer it gets, how long each took and when it came
    (``time.monotonic()``)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.answers: list[tuple[int, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Steady:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            n = 0
            while not self._stop.wait(0.1):
                n += 1
                started = time.monotonic()
                body = event(f"steady-{n}", f"contact:steady-{n}", visits={"increment": 1})
                answer = self.stack.post(body, client=client)
                answered = time.monotonic()
                self.answers.append((answer.status_code, answered - started, answered))


def test_a_client_dribbling_its_headers_is_cut_off_while_others_are_served(stack: Stack) -> None:
    # Given a receiver whose clients must send their headers within 2 s
    stack.receiver(header_timeout_s=2)
    with Steady(stack) as steady, _connection(stack.url) as slow:
        # When a client sends its request one byte a second
        request = _request(_body("dribble-1"))
        started = time.monotonic()
        sent = 0
        try:
            for byte in request[:10]:
                slow.sendall(bytes([byte]))
                sent += 1
                time.sleep(1)
        except OSError:
            pass  # the server may already have closed it
        # Then it is answered 408 and its connection closed, within the bound and a sweep
        status, headers, body = _answer(slow)
        cut_off = time.monotonic()
        assert status == 408, body
        assert headers["connection"] == "close"
        assert json.loads(body)["error"] == "header_timeout"
        assert _closed(slow)
        assert time.monotonic() - started < 2 + 5, "cut off well before its headers ended"
        assert sent < len(request)
    # And the other sender was served all along, every delivery accepted, several of them
    # while the slow client still held its connection (by what was served when, not by
    # how fast: a busy machine slows every answer alike)
    assert len(steady.answers) >= 10
    assert {status for status, _, _ in steady.answers} == {202}
    assert sum(started < at < cut_off for _, _, at in steady.answers) >= 2, steady.answers
    # And the refusal is counted on the operations listener
    assert _refused(stack, "header_timeout") == 1


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(
    stack: Stack,
) -> None:
    stack.receiver(header_timeout_s=1)
    with _connection(stack.url) as silent:
        status, _, body = _answer(silent)
        assert status == 408
        assert json.loads(body)["error"] == "header_timeout"
        assert _closed(silent)


def test_an_idle_keep_alive_connection_has_no_header_deadline_until_its_next_request(
    stack: Stack,
) -> None:
    # Given a receiver with a header timeout of 1 s, and a connection served once
    stack.receiver(header_timeout_s=1)
    with _connection(stack.url) as sock:
        sock.sendall(_request(_body("idle-1")))
        assert _answer(sock)[0] == 202
        # When it stays idle for longer than the header timeout (under the keep-alive)
        time.sleep(3)
        # Then its next request is served on it
        sock.sendall(_request(_body("idle-2")))
        assert _answer(sock)[0] == 202


def test_headers_over_the_size_bound_are_answered_431_and_closed(stack: Stack) -> None:
    # Given a receiver taking at most 4 KiB of request line and headers
    stack.receiver(header_max_bytes=4096)
    big = b"x-padding: " + b"a" * 8192 + b"\r\n"
    # When one client sends 8 KiB of one header, in one piece (headers complete) ...
    with _connection(stack.url) as sock:
        body = _body("big-1")
        request = _request(body)
        head, _, _ = request.partition(b"\r\n\r\n")
        sock.sendall(head + b"\r\n" + big + b"\r\n" + body)
        status, headers, answer = _answer(sock)
        assert status == 431, answer
        assert headers["connection"] == "close"
        assert _closed(sock)
    # ... and another keeps sending header bytes that never end
    with _connection(stack.url) as sock:
        sock.sendall(b"POST /webhooks/demo HTTP/1.1\r\nhost: test\r\n")
        try:
            for _ in range(64):
                sock.sendall(b"x-more: " + b"b" * 1000 + b"\r\n")
        except OSError:
            pass
        status, _, answer = _answer(sock)
        assert status == 431, answer
        assert json.loads(answer)["error"] == "headers_too_large"
        assert _closed(sock)
    # Then neither event was accepted: the same event sent properly is new (202)
    assert stack.post(event("big-1", "contact:big-1", visits={"increment": 1})).status_code == 202
    assert _refused(stack, "headers_too_large") == 2


def test_a_body_slower_than_the_body_timeout_is_answered_408_and_records_nothing(
    stack: Stack,
) -> None:
    # Given a receiver that takes a body within 2 s of its headers
    stack.receiver(body_timeout_s=2)
    body = _body("slow-body-1")
    with Steady(stack) as steady, _connection(stack.url) as sock:
        # When a client sends its headers, then its body a byte a second
        request = _request(body)
        head, _, _ = request.partition(b"\r\n\r\n")
        sock.sendall(head + b"\r\n\r\n")
        try:
            for byte in body[:8]:
                sock.sendall(bytes([byte]))
                time.sleep(1)
        except OSError:
            pass
        # Then it is answered 408 and closed
        status, headers, answer = _answer(sock)
        assert status == 408, answer
        assert json.loads(answer)["error"] == "body_timeout"
        assert headers["connection"] == "close"
        assert _closed(sock)
    assert {status for status, _, _ in steady.answers} == {202}
    # And nothing of it was recorded: the same event sent whole is accepted as new
    again = stack.post(json.loads(body))
    assert again.status_code == 202, again.text
    assert _refused(stack, "body_timeout") == 1


def test_past_max_connections_a_new_one_gets_503_and_open_ones_are_never_stalled(
    stack: Stack,
) -> None:
    # Given a receiver that serves at most 4 connections, and 4 open and served once
    stack.receiver(max_connections=4)
    opened = [socket.create_connection(_address(stack.url), timeout=30) for _ in range(4)]
    try:
        for n, sock in enumerate(opened):
            sock.sendall(_request(_body(f"open-{n}")))
            assert _answer(sock)[0] == 202
        # When a fifth connection sends a delivery
        with _connection(stack.url) as fifth:
            fifth.sendall(_request(_body("fifth-1")))
            status, headers, answer = _answer(fifth)
            # Then it is answered 503 with Retry-After and Connection: close, and closed
            assert status == 503, answer
            assert headers["connection"] == "close"
            assert int(headers["retry-after"]) >= 1
            assert json.loads(answer)["error"] == "too_many_connections"
            assert _closed(fifth)
        # And each connection already open is served at once, several times over
        for round_ in range(3):
            for n, sock in enumerate(opened):
                sock.sendall(_request(_body(f"open-{n}-{round_}")))
                started = time.monotonic()
                assert _answer(sock)[0] == 202
                assert time.monotonic() - started < 5
        # And once one of them closes, a new connection is served
        opened.pop().close()

        def a_new_one_is_served() -> bool:
            with _connection(stack.url) as sock:
                sock.sendall(_request(_body(f"later-{time.monotonic_ns()}")))
                return _answer(sock)[0] == 202

        wait_until(a_new_one_is_served, 30, "a new connection to be served")
    finally:
        for sock in opened:
            sock.close()
    # And the refusal was not an accept: fifth-1 sent again is new
    assert stack.post(event("fifth-1", "contact:fifth-1", visits={"increment": 1})).status_code == (
        202
    )
    assert _refused(stack, "too_many_connections") == 1


def test_the_webhook_port_serves_no_metrics_the_operations_listener_does(stack: Stack) -> None:
    stack.receiver()
    assert stack.post(event("m-1", "contact:m-1", visits={"increment": 1})).status_code == 202
    # The port that faces the internet answers /metrics as any unknown path: 404
    for path in ("/metrics", "/metrics/", "/ops/metrics"):
        assert httpx.get(f"{stack.url}{path}", timeout=10).status_code == 404
    # Its health checks and outcome routes are where they were
    assert httpx.get(f"{stack.url}/healthz", timeout=10).status_code == 200
    assert httpx.get(f"{stack.url}/readyz", timeout=10).status_code == 200
    # The operations listener, on loopback, serves the metrics and nothing of the webhooks
    assert stack.ops_url.startswith("http://127.0.0.1:")
    metrics = httpx.get(f"{stack.ops_url}/metrics", timeout=10)
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    wait_until(  # the receiver writes its counts within counts_flush_ms
        lambda: "keylane_accepted_total 1.0" in httpx.get(f"{stack.ops_url}/metrics").text,
        30,
        "the accept counted",
    )
    posted = httpx.post(f"{stack.ops_url}/webhooks/demo", json={}, timeout=10)
    assert posted.status_code == 404

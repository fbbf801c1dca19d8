"""The receiver's answers (the external contract), over real HTTP against a real receiver
process: every 4xx changes nothing in Redis or the store."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from keylane.producers.queue_watch import MAX_RETRY_AFTER_S
from tests.conftest import delete_namespace, fast_settings
from tests.support.stack import Stack, event, wait_until


def _snapshot(stack: Stack) -> dict[str, Any]:
    """Every key of the namespace with its type and size, plus the store's contents."""
    client = redis.Redis.from_url(stack.settings.redis_dsn())
    keys: dict[str, Any] = {}
    ignored = (":members", ":member:", ":lease:", ":_kombu", ":unacked")
    for raw in client.scan_iter(match=f"{stack.settings.namespace}:*"):
        key = raw.decode()
        if any(part in key for part in ignored):
            continue  # heartbeats move by themselves
        if key.startswith(stack.settings.keys.door("")):
            continue  # a refusal kept at the door (ops/docs/deliveries.md): no mark, no event
        kind = client.type(raw).decode()
        size = {
            "list": client.llen,
            "hash": client.hlen,
            "zset": client.zcard,
            "stream": client.xlen,
        }.get(kind)
        keys[key] = (kind, size(raw) if size else client.get(raw))
    client.close()
    store = stack.open_store()
    return {
        "redis": keys,
        "journal": store.journal_size(),
        "records": store.record_keys(limit=1000),
    }


@pytest.fixture(scope="module")
def running(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One deployment for the module's tests: each compares the state before and after
    its own request, so they need not start from scratch."""
    tmp = tmp_path_factory.mktemp("contract")
    ns = f"kltest-{uuid.uuid4().hex[:10]}"
    stack = Stack(
        fast_settings(redis_url, ns, f"sqlite:///{tmp / 'store.sqlite3'}", tmp / "data"), tmp
    )
    try:
        stack.worker(lanes=2)
        stack.receiver()
        stack.wait_all_owned()
        # one accepted event, so the snapshot has something to compare
        assert stack.post(event("seed", "contact:1", n={"increment": 1})).status_code == 202
        stack.wait_journal(1)
        stack.settled_counters()  # its counts written: the snapshots compare what a request did
        yield stack
    finally:
        stack.stop_all()
        delete_namespace(redis_url, ns)


BAD_INPUT = [
    pytest.param(b"{not json", {}, 400, "malformed_json", id="malformed-json"),
    pytest.param(
        json.dumps({"id": "e1", "changes": {"a": {"set": 1}}}).encode(),
        {},
        400,
        "invalid",
        id="missing-record-key",
    ),
    pytest.param(
        json.dumps(event("e2", "k:1", a={"multiply": 2})).encode(),
        {},
        400,
        "invalid",
        id="unknown-operation",
    ),
    pytest.param(
        json.dumps(event("e3", "k:1", a={"increment": "x"})).encode(),
        {},
        400,
        "invalid",
        id="increment-of-text",
    ),
    pytest.param(json.dumps(event("e4", "k:1")).encode(), {}, 400, "invalid", id="no-changes"),
    pytest.param(json.dumps([1, 2]).encode(), {}, 400, "invalid", id="not-an-object"),
    pytest.param(b"[" * 100 + b"]" * 100, {}, 400, "too_deep", id="too-deep"),
    pytest.param(
        b'{"id": "e5", "record_key": "k", "changes": {"a": {"set": "' + b"x" * (2 << 20) + b'"}}}',
        {},
        413,
        "too_large",
        id="2MB-body",
    ),
    pytest.param(
        json.dumps(event("e6", "k:1", a={"set": 1})).encode(),
        {"content-type": "text/plain"},
        415,
        "unsupported_media_type",
        id="text-plain",
    ),
    pytest.param(
        json.dumps(event("e7", "k:1", a={"set": 1})).encode(),
        {"content-type": ""},
        415,
        "unsupported_media_type",
        id="no-media-type",
    ),
    # Bodies of the other formats, each refused before anything is read into a tree
    pytest.param(
        b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
        b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;">]>'
        b"<l>&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;</l>",
        {"content-type": "text/xml"},
        400,
        "xml_forbidden",
        id="xml-bomb",
    ),
    pytest.param(
        b"k" + b"[a]" * 40 + b"=1",
        {"content-type": "application/x-www-form-urlencoded"},
        400,
        "too_deep",
        id="form-too-deep",
    ),
    pytest.param(
        b"a=1&a[b]=2",
        {"content-type": "application/x-www-form-urlencoded"},
        400,
        "form_conflict",
        id="form-value-and-group",
    ),
    pytest.param(
        b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n--x--\r\n',
        {"content-type": "multipart/form-data"},
        400,
        "malformed_multipart",
        id="multipart-without-boundary",
    ),
    pytest.param(
        b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\n'
        + b"y" * (300 << 10)
        + b"\r\n--x--\r\n",
        {"content-type": "multipart/form-data; boundary=x"},
        413,
        "part_too_large",
        id="multipart-field-too-large",
    ),
]


@pytest.mark.parametrize(("body", "headers", "status", "code"), BAD_INPUT)
def test_bad_input_gets_a_clear_4xx_and_changes_nothing(
    running: Stack, body: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    # Given a running deployment and a snapshot of its state
    before = _snapshot(running)
    # When a bad delivery arrives
    answer = httpx.post(
        f"{running.url}/webhooks/demo",
        content=body,
        headers={"content-type": "application/json", **headers},
        timeout=30,
    )
    # Then it gets the right 4xx with a JSON body that says what is wrong
    assert answer.status_code == status, answer.text
    assert answer.json()["error"] == code
    assert answer.json()["detail"]
    # in a sender's words: none of pydantic's own phrases or class names
    for leak in ("Input should", "instance of", "Value error", "Field required", "Envelope"):
        assert leak not in answer.json()["detail"], answer.json()["detail"]
    # And nothing changed: no queue entry, no dedupe mark, no record, no journal entry
    assert _snapshot(running) == before


def test_xml_that_names_outside_things_fetches_nothing(running: Stack) -> None:
    # Given a server that notes every request it gets
    asked: list[str] = []

    class Noting(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'<!ENTITY leak "leaked">')

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Noting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    where = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        before = _snapshot(running)
        # When deliveries name an external DTD, an external entity and a parameter entity
        for body in (
            f'<?xml version="1.0"?><!DOCTYPE r SYSTEM "{where}/evil.dtd"><r/>',
            f'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "{where}/x">]><r>&x;</r>',
            f'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY % p SYSTEM "{where}/p"> %p;]><r/>',
        ):
            answer = httpx.post(
                f"{running.url}/webhooks/demo",
                content=body.encode(),
                headers={"content-type": "application/xml"},
                timeout=30,
            )
            # Then each is a 400 that says why, nothing is fetched and nothing changes
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"] == "xml_forbidden"
        assert asked == []
        assert _snapshot(running) == before
    finally:
        server.shutdown()
        server.server_close()


def test_unknown_source_is_404_and_changes_nothing(running: Stack) -> None:
    before = _snapshot(running)
    answer = running.post(event("x1", "k:1", a={"set": 1}), source="nosuchsource")
    assert answer.status_code == 404
    assert answer.json()["error"] == "unknown_source"
    assert _snapshot(running) == before


def test_accept_duplicate_and_reuse_answers(running: Stack) -> None:
    # When an event is delivered, then again, then with the same id and another body
    first = running.post(event("d1", "contact:9", n={"increment": 2}))
    again = running.post(event("d1", "contact:9", n={"increment": 2}))
    reused = running.post(event("d1", "contact:9", n={"increment": 50}))
    reused_again = running.post(event("d1", "contact:9", n={"increment": 50}))
    # Then: 202 with event id, record key and shard; 200 replaying it (the first answer
    # while the lane has not decided the event, what became of it once it has); 409
    # (twice)
    assert first.status_code == 202
    body = first.json()
    assert body["event_id"] == "d1"
    assert body["record_key"] == "contact:9"
    assert body["shard"] == running.settings.shards.shard_for_key("contact:9")
    assert again.status_code == 200
    replayed = again.json()
    assert replayed == body or (
        (replayed["status"], replayed["event_id"], replayed["revision"]) == ("applied", "d1", 1)
    ), replayed
    assert again.headers["keylane-replayed"] == "true"
    assert reused.status_code == 409
    assert reused.json()["error"] == "id_reused"
    assert reused_again.status_code == 409
    # And the record got the first body once, and the reuse is one review row
    running.wait_journal(2)
    store = running.open_store()
    from keylane.workers.store_rows import DeadLetterFilter
    from tests.support.stack import wait_until

    wait_until(
        lambda: len(store.dead_letters(DeadLetterFilter(reasons=("id_reused",)))) == 1,
        10,
        "the reuse review row",
    )
    assert store.read("contact:9").fields["n"] == 2
    row = store.dead_letters(DeadLetterFilter(reasons=("id_reused",)))[0]
    assert row.event_id == "d1"
    assert row.attempted_change == {"n": {"increment": 50}}


def test_health_and_readiness(running: Stack) -> None:
    assert httpx.get(f"{running.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{running.url}/readyz").json() == {"status": "ready"}


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_broker_down_is_503_with_retry_after(stack: Stack) -> None:
    # Given a receiver whose Redis is unreachable
    stack.settings = stack.settings.model_copy(
        update={"redis_url": "redis://127.0.0.1:1/0"}
    )  # nothing listens on port 1
    stack.receiver()
    # When a delivery arrives, then it is refused with 503 and Retry-After
    answer = stack.post(event("b1", "k:1", a={"set": 1}))
    assert answer.status_code == 503
    assert answer.json()["error"] == "broker_unavailable"
    assert int(answer.headers["retry-after"]) > 0
    assert httpx.get(f"{stack.url}/readyz").status_code == 503


def _post_raw(url: str, body: bytes, chunked: bool) -> str:
    """POST ``body`` as a sender that writes all of it before reading (most do), asking
    for the connection to be closed after the answer; the answer's status line, or the
    socket error the sender saw."""
    host, port = url.removeprefix("http://").split(":")
    head = (
        "POST /webhooks/demo HTTP/1.1\r\nHost: keylane\r\nConnection: close\r\n"
        "Content-Type: application/json\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        try:
            if chunked:
                sock.sendall(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode())
                for start in range(0, len(body), 1 << 16):
                    piece = body[start : start + (1 << 16)]
                    sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                sock.sendall(b"0\r\n\r\n")
            else:
                sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            answer = b""
            while b"\r\n" not in answer:
                data = sock.recv(1 << 16)
                if not data:
                    break
                answer += data
        except OSError as exc:
            return repr(exc)
    return answer.split(b"\r\n", 1)[0].decode()


def test_oversize_bodies_from_32_concurrent_senders_all_read_413(running: Stack) -> None:
    # Given 32 senders, each writing a body over the 1 MiB limit in full before reading,
    # half with a declared length and half chunked, all asking to close afterwards
    limit = running.settings.max_body_bytes
    bodies = [
        b'{"id": "big", "record_key": "k:1", "changes": {"a": {"set": "'
        + b"x" * (2 * limit + 65536 * n)
        + b'"}}}'
        for n in range(32)
    ]
    # When they all send at once, three rounds
    with ThreadPoolExecutor(32) as pool:
        answers = [
            status
            for _ in range(3)
            for status in pool.map(
                lambda n: _post_raw(running.url, bodies[n], chunked=n % 2 == 1), range(32)
            )
        ]
    # Then every one of them read a 413, none a connection reset
    assert answers == ["HTTP/1.1 413 Request Entity Too Large"] * 96, Counter(answers)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_full_shard_that_does_not_drain_answers_the_retry_after_ceiling(stack: Stack) -> None:
    # Given a receiver with a high-water mark of 3 per shard and no worker draining
    stack.settings = stack.settings.model_copy(update={"shard_high_water": 3})
    stack.receiver()
    # When one record's shard fills up and more deliveries arrive, at once and later on
    for n in range(3):
        assert stack.post(event(f"f-{n}", "full:1", a={"set": n})).status_code == 202
    answers = [stack.post(event(f"f-x{n}", "full:1", a={"set": n})) for n in range(5)]
    shard = stack.settings.shards.shard_for_key("full:1")
    wait_until(
        lambda: (
            f'keylane_queue_depth{{shard="{shard}"}} 3.0'
            in httpx.get(f"{stack.ops_url}/metrics").text
        ),
        10,
        "the receiver's queue watch to see the full shard",
    )
    answers.append(stack.post(event("f-late", "full:1", a={"set": 9})))
    # Then each is 503 shard_full with the documented ceiling, never a short wait
    assert {a.status_code for a in answers} == {503}
    assert {a.json()["error"] for a in answers} == {"shard_full"}
    assert {int(a.headers["retry-after"]) for a in answers} == {MAX_RETRY_AFTER_S}


def test_an_idle_connection_is_kept_past_uvicorns_five_seconds(running: Stack) -> None:
    # Given a connection that sent one request and then sat idle for 6 s (a pooled client
    # or a load balancer keeps it; uvicorn's own default closes it after 5 s, and a
    # request sent as it closes is reset)
    host, port = running.url.removeprefix("http://").split(":")
    request = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        assert _whole_answer(conn).startswith(b"HTTP/1.1 200")
        time.sleep(6)
        # When it sends the next request, Then the receiver answers it on that connection
        conn.sendall(request)
        assert _whole_answer(conn).startswith(b"HTTP/1.1 200")


def _whole_answer(conn: socket.socket) -> bytes:
    """One answer read from ``conn``: its head and its JSON body (b"" if it was closed)."""
    data = b""
    while b"\r\n\r\n" not in data or not data.endswith(b"}"):
        chunk = conn.recv(4096)
        if not chunk:
            break
        data += chunk
    return data

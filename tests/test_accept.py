"""The one accept path (``producers/accept.py``): what the receiver and ``task.send`` build
is what a lane reads back; the accept script is called by its SHA; a delivery's JSON is
read exactly (no NaN, no Infinity, every digit kept) and an HTTP forward sends its bytes
as they came, under keylane's own signature over those bytes."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from keylane.producers.accept import body_sha256, new_event, payload_body
from keylane.producers.formats import parse_json
from keylane.producers.gateway import LoadedScript, ReceiverGateway
from keylane.routing import ShardMap
from keylane.routing.contract.errors import InvalidEvent
from keylane.routing.contract.events import Event, wire_changes
from keylane.routing.contract.message import event_message, parse_message
from keylane.routing.contract.settings import Settings
from tests.support.http_server import serving
from tests.support.stack import Stack, wait_until

SHARDS = ShardMap(64)
HOOK_SECRET = "whsec_" + base64.b64encode(b"forward-secret-32-bytes-long....").decode()


def test_an_accepted_event_is_what_a_lane_reads_back() -> None:
    # Given an event built by the accept path from a checked delivery
    changes = wire_changes({"visits": {"increment": 1}, "tags": {"add": "vip"}, "x": {"unset": 1}})
    event = new_event(
        SHARDS,
        source="demo",
        event_id="evt_1",
        event_type="contact.updated",
        record_key="contact:42",
        changes=changes,
        body_sha256="ab" * 32,
    )
    # When its message is read as a lane reads it
    read = Event.model_validate(
        parse_message(event_message(event.wire, event.queue)).kwargs["event"]
    )
    # Then the lane has exactly the event that was built, in the shard the answer names
    assert read.model_dump(mode="json") == event.wire
    assert read.shard == SHARDS.shard_for_key("contact:42") == json.loads(event.answer)["shard"]
    assert json.loads(event.answer) == {
        "status": "accepted",
        "source": "demo",
        "event_id": "evt_1",
        "record_key": "contact:42",
        "shard": read.shard,
        "queue": event.queue,
    }


def test_a_forwarded_event_carries_the_body_and_a_task_reads_its_payload() -> None:
    # Given a delivery for a task or destination, with spacing, non-ASCII text, a
    # trailing zero and an integer past 64 bits
    raw = (
        b'{"id": "p1",   "name": "Zo\xc3\xab", "price": 1.10, "n": 123456789012345678901234567890}'
    )
    event = new_event(
        SHARDS,
        source="shop",
        event_id="p1",
        event_type="event",
        record_key="product:p1",
        body_sha256=body_sha256(raw),
        destination="hook",
        body=raw.decode(),
    )
    # When a lane reads its message
    read = Event.model_validate(
        parse_message(event_message(event.wire, event.queue)).kwargs["event"]
    )
    # Then the body is there byte for byte, and the payload a task gets is read from it
    assert read.body is not None
    assert read.body.encode() == raw
    assert read.payload == {
        "id": "p1",
        "name": "Zoë",
        "price": 1.1,
        "n": 123456789012345678901234567890,
    }


def test_a_python_send_is_written_one_way_and_refuses_what_is_not_json() -> None:
    # A payload's text does not depend on key order, so a resend is a duplicate
    assert payload_body({"b": 1, "a": [1.5]}) == payload_body({"a": [1.5], "b": 1})
    for bad in ({"n": float("nan")}, {"n": float("inf")}, {"s": "\ud800"}, {1: 2, "a": 1}):
        with pytest.raises(InvalidEvent, match="not JSON"):
            payload_body(bad)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("event_id", "", "the event id must be 1..255"),
        ("event_id", "x" * 256, "the event id must be 1..255"),
        ("record_key", "k" * 513, "the record key must be 1..512"),
        ("record_key", "k\x00", "NUL"),
        ("event_type", "t\x00", "NUL"),
    ],
)
def test_the_accept_path_refuses_ids_keys_and_types_a_store_cannot_hold(
    field: str, value: str, message: str
) -> None:
    fields = {"event_id": "e", "event_type": "t", "record_key": "k", **{field: value}}
    with pytest.raises(InvalidEvent, match=message):
        new_event(SHARDS, source="demo", body_sha256="0" * 64, **fields)


@pytest.mark.parametrize(
    "body", [b'{"n": 1e400}', b'{"n": NaN}', b'{"n": -Infinity}', b'{"n": Infinity}', b"[-1e999]"]
)
def test_non_finite_numbers_are_not_json(body: bytes) -> None:
    # Given a body Python's json module would read as NaN or infinity, When it is
    # parsed, Then it is malformed JSON (400 malformed_json)
    with pytest.raises(InvalidEvent) as caught:
        parse_json(body)
    assert caught.value.code == "malformed_json"


def test_json_is_read_exactly() -> None:
    assert parse_json(b'{"n": 123456789012345678901234567890}') == {
        "n": 123456789012345678901234567890
    }
    assert parse_json(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}  # a UTF-8 byte order mark


def test_a_script_redis_does_not_have_is_loaded_and_then_called_by_its_sha(
    settings: Settings,
) -> None:
    # Given a script Redis has never seen (a new one: nothing else is flushed)
    script = LoadedScript(f"return 'ok' -- {uuid.uuid4().hex}")

    async def run() -> tuple[Any, Any, list[int]]:
        gateway = ReceiverGateway.from_url(settings.redis_dsn(), settings.keys, settings.shards)
        try:
            assert await gateway.client.script_exists(script.sha) == [False]
            # When it is run twice
            first = await gateway._run(script, [], [])
            second = await gateway._run(script, [], [])
            return first, second, await gateway.client.script_exists(script.sha)
        finally:
            await gateway.close()

    first, second, exists = asyncio.run(run())
    # Then both runs answer, and Redis now holds it under its SHA
    assert first == second == b"ok"
    assert exists == [True]


# -- end to end --------------------------------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    calls: list[tuple[dict[str, str], bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.calls.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    calls: list[tuple[dict[str, str], bytes]] = []
    with serving(type("Recorder", (_Recorder,), {"calls": calls})) as url:
        yield url, calls


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_an_http_forward_sends_the_delivery_bytes_as_they_came(
    stack: Stack, tmp_path: Path, hook: tuple[str, list[tuple[dict[str, str], bytes]]]
) -> None:
    url, calls = hook
    # Given a source forwarding to a signed HTTP destination
    sources = tmp_path / "sources.toml"
    sources.write_text(
        '[sources.shop]\ndestination = "hook"\nrecord_key = "product:{body:id}"\n\n'
        f'[destinations.hook]\nkind = "http"\nurl = "{url}/hook"\n'
        'secret_env = "TEST_HOOK_SECRET"\n'
    )
    stack.settings = stack.settings.model_copy(update={"sources_file": sources})
    stack.extra_env["TEST_HOOK_SECRET"] = HOOK_SECRET
    stack.worker(lanes=2)
    stack.receiver()
    stack.wait_all_owned()
    # When bodies with non-finite numbers arrive, Then each is 400 malformed_json
    for bad in (
        b'{"id": "p0", "n": 1e400}',
        b'{"id": "p0", "n": NaN}',
        b'{"id": "p0", "n": -Infinity}',
    ):
        answer = stack.post(bad, source="shop")
        assert (answer.status_code, answer.json()["error"]) == (400, "malformed_json"), bad
    # And when a delivery arrives with spacing, non-ASCII text and a trailing zero
    raw = b'{"id": "p1",   "name": "Zo\xc3\xab", "price": 1.10}'
    assert stack.post(raw, source="shop").status_code == 202
    wait_until(lambda: len(calls) >= 1, 60, "the forward", on_timeout=stack.logs)
    # Then the destination got those very bytes, signed by keylane over them
    headers, body = calls[0]
    assert body == raw
    Webhook(HOOK_SECRET).verify(body, headers)  # raises if the signature does not match
    assert headers["idempotency-key"] == "shop/p1"
    # And only that one delivery was forwarded
    stack.wait_journal(1)
    assert len(calls) == 1

"""Deliveries turned away at the door (ops/docs/deliveries.md), through a real receiver:
each refusal kept in its source's bounded Redis stream, redacted, an unverified one
without its body; keeping one marks nothing seen and never changes the answer."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis

from keylane.ops.deliveries import parse_delivery_id
from keylane.producers.answers import error_answer
from keylane.producers.door import Door, Seen
from keylane.producers.gateway import DoorEntry, DoorLog
from keylane.routing.contract.door import DOOR_BODY_MAX_BYTES, body_holds_secret
from keylane.routing.contract.errors import KeylaneError
from keylane.routing.contract.sources import parse_sources
from keylane.routing.redis_keys import RedisKeys
from tests.support.stack import Stack, event, wait_until

SECRET = "forms-secret-123"
SOURCES = """
[sources.forms]
verify = { scheme = "hmac", secrets_env = ["FORMS_SECRET"], header = "X-Checksum" }

[sources.loop]
verify = { scheme = "none" }

[sources.other]
verify = { scheme = "none" }
"""


def _deploy(stack: Stack, tmp_path: Path, **settings: Any) -> None:
    stack.use_sources(SOURCES, **settings)
    stack.extra_env["FORMS_SECRET"] = SECRET


def _signed(body: bytes) -> str:
    return hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()


def _post(stack: Stack, source: str, body: bytes, query: str = "", **headers: str) -> int:
    url = f"{stack.url}/webhooks/{source}{query}"
    hdrs = {"content-type": "application/json", **headers}
    return httpx.post(url, content=body, headers=hdrs, timeout=30).status_code


def _listed(stack: Stack, *args: str) -> list[dict[str, Any]]:
    done = stack.keylane("deliveries", "list", "--json", *args)
    assert done.returncode == 0, done.stderr
    found: list[dict[str, Any]] = json.loads(done.stdout)["deliveries"]
    return found


def _wait_listed(stack: Stack, count: int, *args: str) -> list[dict[str, Any]]:
    wait_until(lambda: len(_listed(stack, *args)) >= count, 30, f"{count} kept", stack.logs)
    return _listed(stack, *args)


def _shown(stack: Stack, delivery_id: str) -> dict[str, Any]:
    done = stack.keylane("deliveries", "show", delivery_id, "--json", "--body")
    assert done.returncode == 0, done.stderr
    shown: dict[str, Any] = json.loads(done.stdout)
    return shown


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_an_unverified_delivery_is_kept_without_its_body_and_its_secrets(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a receiver with a source whose sender signs in X-Checksum
    _deploy(stack, tmp_path)
    stack.receiver()
    # When a delivery comes with a forged signature, a bearer token, a cookie and a token
    # in its query string
    body = json.dumps(event("evt-forged", "contact:1", n={"increment": 1})).encode()
    status = _post(
        stack,
        "forms",
        body,
        "?token=abc123&page=2",
        **{"X-Checksum": "0" * 64, "Authorization": "Bearer sekrit", "Cookie": "s=1"},
    )
    # Then it is answered 401, and kept as unverified: metadata only
    assert status == 401
    (listed,) = _wait_listed(stack, 1, "--status", "unverified")
    assert (listed["status"], listed["status_name"], listed["code"]) == (
        401,
        "unverified",
        "bad_signature",
    )
    shown = _shown(stack, listed["id"])
    assert "body" not in shown
    assert shown["body_kept"] == 0
    assert not shown["verified"]
    assert (shown["size"], shown["sha256"]) == (len(body), hashlib.sha256(body).hexdigest())
    headers = shown["headers"]
    assert headers["x-checksum"] == headers["authorization"] == "[redacted]"
    assert headers["cookie"] == "[redacted]"
    assert headers["content-type"] == "application/json"
    assert shown["query"] == "token=%5Bredacted%5D&page=2"
    assert "sekrit" not in json.dumps(shown)
    assert "abc123" not in json.dumps(shown)
    # And the text view says so
    text = stack.keylane("deliveries", "show", listed["id"]).stdout
    assert "401 unverified (bad_signature)" in text
    assert "not kept (unverified" in text


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_an_invalid_body_is_kept_with_its_body_and_the_bound_holds(
    stack: Stack, tmp_path: Path
) -> None:
    # Given a receiver that keeps the last 3 refusals per source
    _deploy(stack, tmp_path, door_keep=3)
    stack.receiver()
    # When 5 deliveries come whose bodies are not keylane's envelope
    bodies = [json.dumps({"id": f"bad-{n}", "record_key": "x"}).encode() for n in range(5)]
    assert [_post(stack, "loop", body) for body in bodies] == [400] * 5
    # Then the newest 3 are kept, newest first, each with its body as it came
    wait_until(
        lambda: (
            stack.view().client.xlen(f"{stack.settings.keys.door('loop')}") == 3
            and stack.view().door_page("loop", "+", "-", 10)[0][1].get(b"body") == bodies[4]
        ),
        30,
        "the newest 3 kept",
        stack.logs,
    )
    listed = _listed(stack, "--source", "loop", "--since", "1h")
    assert [e["status_name"] for e in listed] == ["invalid"] * 3
    table = stack.keylane("deliveries").stdout.splitlines()  # alone: the list
    assert [line.split()[0] for line in table[1:]] == [e["id"] for e in listed]
    assert table[1].split()[3:5] == ["400", "invalid"]
    kept = [_shown(stack, e["id"])["body"].encode() for e in listed]
    assert kept == bodies[:1:-1]
    raw = stack.keylane("deliveries", "show", listed[0]["id"], "--body")
    assert raw.stdout.encode() == bodies[4]
    # And a page of 2 leads to the next
    first = json.loads(stack.keylane("deliveries", "list", "--json", "--limit", "2").stdout)
    rest = _listed(stack, "--before", first["next_before"])
    assert [e["id"] for e in first["deliveries"] + rest] == [e["id"] for e in listed]


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_throttled_delivery_is_kept(stack: Stack, tmp_path: Path) -> None:
    # Given no worker, a global mark of 4 (each source's share: 2), and another source's
    # event waiting
    _deploy(stack, tmp_path, global_high_water=4)
    stack.receiver()
    assert _post(stack, "other", json.dumps(event("o-1", "o:1", n={"increment": 1})).encode())
    # When the loop source sends past its share
    answers = [
        _post(stack, "loop", json.dumps(event(f"l-{n}", f"l:{n}", n={"increment": 1})).encode())
        for n in range(4)
    ]
    # Then its deliveries past its share are answered 429 and kept, with their bodies
    assert answers[:2] == [202, 202], answers
    assert 429 in answers[2:], answers
    listed = _wait_listed(stack, answers.count(429), "--status", "429")
    assert {e["status_name"] for e in listed} == {"throttled"}
    assert _shown(stack, listed[0]["id"])["body"].startswith('{"id": "l-')


@pytest.mark.slow
def test_keeping_refusals_marks_nothing_seen(stack: Stack, tmp_path: Path) -> None:
    # Given a deployment with a worker
    _deploy(stack, tmp_path)
    stack.worker()
    stack.receiver()
    stack.wait_all_owned()
    # When a delivery is refused as forged, then as invalid, each kept
    good = json.dumps(event("evt-7", "contact:7", visits={"increment": 1})).encode()
    assert _post(stack, "forms", good, **{"X-Checksum": "f" * 64}) == 401
    bad = json.dumps({"id": "evt-7", "record_key": "contact:7"}).encode()
    assert _post(stack, "forms", bad, **{"X-Checksum": _signed(bad)}) == 400
    _wait_listed(stack, 2, "--source", "forms")
    # Then the same event sent correctly is accepted and applied once
    assert _post(stack, "forms", good, **{"X-Checksum": _signed(good)}) == 202
    assert _post(stack, "forms", good, **{"X-Checksum": _signed(good)}) == 200
    stack.wait_journal(1)
    record = json.loads(stack.keylane("records", "get", "contact:7", "--json").stdout)
    assert record["fields"]["visits"] == 1


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_redis_that_refuses_to_keep_does_not_change_the_answer(
    stack: Stack, tmp_path: Path
) -> None:
    # Given the loop source's stream key taken by a string (every XADD to it fails)
    _deploy(stack, tmp_path)
    stack.receiver()
    client = redis.Redis.from_url(stack.settings.redis_dsn())
    client.set(stack.settings.keys.door("loop"), "not a stream")
    # When an invalid delivery comes, then a good one
    bad = json.dumps({"id": "bad", "record_key": "x"}).encode()
    assert _post(stack, "loop", bad) == 400
    good = json.dumps(event("ok-1", "k:1", n={"increment": 1})).encode()
    assert _post(stack, "loop", good) == 202

    # Then the failure is counted on /metrics, and the answers were as without it
    def failures() -> float:
        text = httpx.get(f"{stack.ops_url}/metrics", timeout=10).text
        line = next(x for x in text.splitlines() if x.startswith("keylane_door_keep_failures"))
        return float(line.split()[-1])

    wait_until(lambda: failures() >= 1, 30, "the failure counted", stack.logs)
    assert _post(stack, "loop", bad) == 400
    assert client.type(stack.settings.keys.door("loop")) == b"string"
    client.close()


def test_a_refusal_waiting_to_be_written_holds_no_more_than_its_stream_will(
    redis_url: str, namespace: str
) -> None:
    # Given a door whose writer cannot run yet (the loop is busy answering)
    source = parse_sources(
        '[sources.door]\nverify = { scheme = "hmac", secrets_env = ["DOOR_S"], header = "X-Sig" }\n'
    ).get("door")
    assert source is not None
    big = b"x" * (1 << 20)

    async def queued() -> list[DoorEntry]:
        client = aioredis.Redis.from_url(redis_url)
        door = Door(DoorLog(client, RedisKeys(namespace)), keep_per_source=10)
        refused = error_answer(400, "malformed_json", "no")
        unverified = error_answer(401, "bad_signature", "no")
        # When a verified 1 MiB body and an unverified one are refused
        door.keep(source, {"x-sig": "s"}, "/webhooks/door", b"", refused, Seen(big, True))
        door.keep(source, {"x-sig": "s"}, "/webhooks/door", b"", unverified, Seen(big, False))
        waiting = list(door._queue)
        await door.close()
        await client.aclose()
        return waiting

    waiting = asyncio.run(queued())
    # Then what waits in memory is the entry as it will be kept: the body cut at the cap,
    # the unverified one's left out, both with the whole body's size
    (_, verified), (_, unverified) = waiting
    assert len(verified["body"]) == DOOR_BODY_MAX_BYTES
    assert "body" not in unverified
    assert verified["size"] == unverified["size"] == 1 << 20


def test_a_delivery_id_that_is_not_one_is_said_so_before_redis_is_asked() -> None:
    # Given ids as `deliveries list` prints them, and ones it never prints
    assert parse_delivery_id("stripe/1733580000000-0") == ("stripe", "1733580000000-0")
    # Then anything else (one format for every kind: SOURCE/MS-SEQ, a source's name) is
    # a clear error (Redis's refusal read as Redis being down)
    for text in ("stripe/garbage", "1733580000000-0", "stripe/", "stripe/1-2-3", "a/b/1-0"):
        with pytest.raises(KeylaneError, match="not a delivery id"):
            parse_delivery_id(text)


def test_a_source_whose_secret_is_in_the_body_keeps_no_body() -> None:
    # Given Microsoft Graph (its clientState, a shared secret, is in each notification)
    # and an HMAC source (its secret never travels)
    graph = parse_sources(
        '[sources.graph]\nverify = { scheme = "microsoft_graph", secrets_env = ["G"] }\n'
    ).get("graph")
    signed = parse_sources(
        '[sources.forms]\nverify = { scheme = "hmac", secrets_env = ["F"], header = "X-Sig" }\n'
    ).get("forms")
    assert graph is not None
    assert signed is not None
    # Then only the HMAC source's refused bodies are kept
    assert body_holds_secret(graph.verify)
    assert not body_holds_secret(signed.verify)

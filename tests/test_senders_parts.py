"""What the senders beyond the first fifteen brought to the core, each checked alone: an
ISO 8601 signed timestamp (Zendesk), a signed public URL (Square), ``item:index``
(Attio), Notion's verification with its token configured, monday.com's challenge."""

from __future__ import annotations

import asyncio
import json

import pytest

from keylane.producers.answers import Answer
from keylane.producers.delivery import read_verified
from keylane.producers.handshakes import Handshakes
from keylane.producers.intake import Parts
from keylane.producers.signatures import Target, verifier_from_environ, verifiers_of
from keylane.producers.signatures.verifier import parse_timestamp
from keylane.routing.contract.errors import SignatureError
from keylane.routing.contract.mapping import Delivery, items_of, render
from keylane.routing.contract.signing import parse_verify_config
from keylane.routing.contract.sources import parse_sources
from tests.support.signers import SIGNERS, Outgoing

PUBLIC_URL = "https://hooks.example.com"


def test_an_iso_8601_timestamp_is_read_with_its_zone() -> None:
    header = "x-zendesk-webhook-signature-timestamp"
    assert parse_timestamp("2021-07-25T10:00:00Z", header, "iso") == 1627207200
    assert parse_timestamp("2021-07-25T12:00:00+02:00", header, "iso") == 1627207200
    assert parse_timestamp("2021-07-25T10:00:00.123456Z", header, "iso") == 1627207200
    # A time without a zone, a date alone, other scripts' digits, an impossible date
    for bad in (
        "2021-07-25T10:00:00",
        "2021-07-25",
        "٢٠٢١-07-25T10:00:00Z",
        "2021-13-40T10:00:00Z",
    ):
        with pytest.raises(SignatureError, match="malformed header"):
            parse_timestamp(bad, header, "iso")


def test_a_zendesk_delivery_outside_the_tolerance_is_refused() -> None:
    verifier = verifier_from_environ(
        parse_verify_config({"scheme": "zendesk", "secrets_env": ["Z"]}), {"Z": "zs"}
    )
    body = b'{"id": "1"}'
    at = 1_767_225_600
    headers = SIGNERS["zendesk"]("zs", Outgoing(body), at)
    assert verifier.verify(headers, body, at + 299).timestamp == at
    with pytest.raises(SignatureError, match="outside tolerance"):
        verifier.verify(headers, body, at + 301)


def test_square_signs_the_public_url_not_the_one_a_request_names() -> None:
    verifier = verifier_from_environ(
        parse_verify_config({"scheme": "square", "secrets_env": ["S"]}), {"S": "sk"}
    )
    body = b'{"event_id": "1"}'
    url = f"{PUBLIC_URL}/webhooks/square"
    headers = SIGNERS["square"]("sk", Outgoing(body, url), 0)
    assert verifier.verify(headers, body, 0, Target(url=url)).scheme == "square"
    with pytest.raises(SignatureError, match="no signature matched"):
        verifier.verify(headers, body, 0, Target(url="https://attacker.example/webhooks/square"))
    with pytest.raises(SignatureError, match="signs the URL"):
        verifier.verify(headers, body, 0, Target())


def test_item_index_is_each_item_s_place_in_the_delivery() -> None:
    body = {"events": [{"a": 1}, {"a": 1}, {"a": 2}]}
    delivery = Delivery(body, {"idempotency-key": "k"})
    ids = [
        render("{header:Idempotency-Key}:{item:index}", delivery.item(item, at, index))
        for index, (item, at) in enumerate(items_of("body:events.*", body))
    ]
    assert ids == ["k:0", "k:1", "k:2"]
    # Outside a batch there is no item: a template that reads one renders nothing
    assert render("{header:Idempotency-Key}:{item:index}", delivery) is None


def test_notion_s_verification_is_answered_also_when_its_token_is_configured() -> None:
    # Given a Notion source whose token is in secrets_env (nothing to keep)
    sources = parse_sources(
        '[sources.notion]\nverify = { scheme = "notion", secrets_env = ["NOTION_TOKEN"] }\n'
    )
    (source,) = sources.all()
    environ = {"NOTION_TOKEN": "secret_configured"}
    handshakes = Handshakes(sources, verifiers_of(sources, environ), environ, None)

    def answer(headers: dict[str, str], body: bytes) -> int | None:
        found = asyncio.run(handshakes.before_verify(source, headers, {}, body))
        return None if found is None else found.status

    # Then its verification is answered 200 (recording nothing: no gateway is even there)
    assert answer({}, b'{"verification_token": "secret_configured"}') == 200
    # And a body with more than the token, or a signed one, is a delivery to verify
    assert answer({}, b'{"verification_token": "t", "type": "page.created"}') is None
    signed_headers = {"x-notion-signature": "sha256=00"}
    assert answer(signed_headers, b'{"verification_token": "t"}') is None


def test_monday_s_challenge_is_echoed_once_its_url_token_holds() -> None:
    # Given a monday.com source, its token in the URL given to monday
    sources = parse_sources(
        '[sources.monday]\nverify = { scheme = "monday", secrets_env = ["MONDAY_URL_TOKEN"] }\n'
    )
    (source,) = sources.all()
    environ = {"MONDAY_URL_TOKEN": "monday-token"}
    verifiers = verifiers_of(sources, environ)
    handshakes = Handshakes(sources, verifiers, environ, None)
    challenge = b'{"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}'

    def read(query: dict[str, str]) -> object:
        parts = Parts(challenge, {"content-type": "application/json"}, query, "json")
        return read_verified(
            source, verifiers["monday"], handshakes, parts, Target(query=query), 0, None, 10
        )

    # When monday sends its challenge to the URL with the token
    answer = read({"key": "monday-token"})
    # Then the same JSON is the answer, and nothing is taken as an event
    assert isinstance(answer, Answer)
    assert answer.status == 200
    assert json.loads(answer.body) == json.loads(challenge)
    # And without the token it is refused, as any delivery would be
    with pytest.raises(SignatureError):
        read({"key": "guess"})

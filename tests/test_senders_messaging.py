"""Messaging and workspace senders as they send (issue 47): Twilio, Slack, Zoom, Meta (Lead
Ads and WhatsApp), Asana and Microsoft Graph, each delivery built and signed by the
provider's own SDK where there is one (``twilio``, ``slack_sdk``), else by its published
recipe (/work/notes/providers.md names the sources), through a real receiver and worker:
applied to its record, its retry a duplicate, a forgery a 401 that records nothing, its
handshake answered, and the answer it expects."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlencode

import pytest
import redis
from slack_sdk.signature import SignatureVerifier
from twilio.request_validator import RequestValidator

from tests.support.senders import (
    PUBLIC_URL,
    applied,
    get,
    refused_changes_nothing,
    replayed,
    send,
    sender_deployment,
    settled,
)
from tests.support.stack import Stack

TWILIO_TOKEN = "twilio-auth-token-0123456789abcdef"
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
ZOOM_SECRET = "zoom-secret-token-Rk6PBBUYBZ"
META_SECRET = "meta-app-secret-4f2b"
META_VERIFY_TOKEN = "meta-verify-token-7d1"
GRAPH_STATE = "graph-client-state-5c0e"
SECRETS = {
    "TWILIO_AUTH_TOKEN": TWILIO_TOKEN,
    "SLACK_SIGNING_SECRET": SLACK_SECRET,
    "ZOOM_SECRET_TOKEN": ZOOM_SECRET,
    "META_APP_SECRET": META_SECRET,
    "META_VERIFY_TOKEN": META_VERIFY_TOKEN,
    "GRAPH_CLIENT_STATE": GRAPH_STATE,
}

SOURCES = """
[sources.twilio]
verify = {scheme = "twilio", secrets_env = ["TWILIO_AUTH_TOKEN"]}
format = "mapped"
record_key = "phone:{body:From}"
on.event = {last_message = {set = "body:Body"}, messages = {increment = 1}}

[sources.slack]
verify = {scheme = "slack", secrets_env = ["SLACK_SIGNING_SECRET"]}
format = "mapped"
record_key = "slack-user:{body:event.user}"
on.app_mention = {last_text = {set = "body:event.text"}, mentions = {increment = 1}}

[sources.zoom]
verify = {scheme = "zoom", secrets_env = ["ZOOM_SECRET_TOKEN"]}
format = "mapped"
record_key = "meeting:{body:payload.object.id}"
on."meeting.started" = {status = {set = "started"}, topic = {set = "body:payload.object.topic"}}
on."meeting.ended" = {status = {set = "ended"}}

[sources.leads]
verify.scheme = "meta"
verify.secrets_env = ["META_APP_SECRET"]
verify.verify_token_env = "META_VERIFY_TOKEN"
format = "mapped"
record_key = "lead:{body:value.leadgen_id}"
on.leadgen = {form = {set = "body:value.form_id"}, page = {set = "delivery:entry.*.id"}}

[sources.whatsapp]
verify.scheme = "meta"
verify.secrets_env = ["META_APP_SECRET"]
verify.verify_token_env = "META_VERIFY_TOKEN"
format = "mapped"
record_key = "wa:{body:value.messages.0.from}"
on.messages.last_message = {set = "body:value.messages.0.text.body"}
on.messages.name = {set = "body:value.contacts.0.profile.name"}
on.messages.messages = {increment = 1}

[sources.asana]
verify = {scheme = "asana"}
format = "mapped"
record_key = "task:{body:resource.gid}"
on."task.changed" = {changed = {add = "body:change.field"}, changes = {increment = 1}}

[sources.graph]
verify = {scheme = "microsoft_graph", secrets_env = ["GRAPH_CLIENT_STATE"]}
format = "mapped"
record_key = "message:{body:resourceData.id}"
on.created = {state = {set = "created"}, resource = {set = "body:resource"}}
on.updated = {state = {set = "updated"}}
"""


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The module's deployment (each test uses records of its own)."""
    with sender_deployment(
        redis_url, tmp_path_factory.mktemp("messaging"), SOURCES, SECRETS
    ) as deployment:
        yield deployment


def _repeat(item: dict[str, object]) -> bool:
    """Whether an item of a batched answer is one seen before: its first answer marked a
    duplicate, or its outcome once decided."""
    return item.get("duplicate") is True or item.get("status") == "applied"


def _unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


# -- Twilio -------------------------------------------------------------------------------


def _twilio(
    params: dict[str, str],
    token: str = TWILIO_TOKEN,
    idempotency: str | None = None,
    query: str = "",
    algorithm: str | None = None,
) -> tuple[bytes, dict[str, str]]:
    """An SMS webhook as Twilio posts it: a form, signed by the twilio SDK over the URL it
    calls (its query string too) and the sorted parameters; with HMAC-SHA256 (a shared
    key's) when ``algorithm`` says so, and the header that tells it."""
    url = f"{PUBLIC_URL}/webhooks/twilio" + (f"?{query}" if query else "")
    signature = RequestValidator(token).compute_signature(url, params, algorithm)
    headers = {"X-Twilio-Signature": signature}
    if algorithm is not None:
        headers["X-Twilio-Webhooks-Signature-Settings"] = f"key=KS123,algorithm={algorithm}"
    if idempotency is not None:
        headers["I-Twilio-Idempotency-Token"] = idempotency
    return urlencode(params).encode(), headers


def _sms(sender: str, text: str) -> dict[str, str]:
    sid = _unique("SM")
    return {
        "ToCountry": "US",
        "SmsMessageSid": sid,
        "NumMedia": "0",
        "SmsSid": sid,
        "SmsStatus": "received",
        "Body": text,
        "To": "+15550001000",
        "MessageSid": sid,
        "AccountSid": "AC0123456789abcdef0123456789abcdef",
        "From": sender,
        "ApiVersion": "2010-04-01",
    }


FORM = "application/x-www-form-urlencoded"


def test_twilio_sms_signed_by_the_twilio_sdk(stack: Stack) -> None:
    phone = "+1555" + str(uuid.uuid4().int)[:7]
    # Given an SMS signed by Twilio's own validator, with Twilio's idempotency token
    body, headers = _twilio(_sms(phone, "Hello"), idempotency=_unique("idem-"))
    answer = send(stack, "twilio", body, headers, content_type=FORM)
    # Then it is accepted, answered with the empty TwiML Twilio expects
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/xml")
    assert answer.text == '<?xml version="1.0" encoding="UTF-8"?><Response/>'
    # And Twilio's retry of it (same token, same signed form) is a duplicate, still TwiML
    retry = send(stack, "twilio", body, headers, content_type=FORM)
    assert replayed(retry)
    assert retry.text == answer.text
    # And a message sent without an idempotency token is deduplicated by its content
    second, second_headers = _twilio(_sms(phone, "Are you there?"))
    assert send(stack, "twilio", second, second_headers, content_type=FORM).status_code == 200
    assert replayed(send(stack, "twilio", second, second_headers, content_type=FORM))
    # And one to a URL with a query string, signed with HMAC-SHA256, is taken too
    query = "tenant=acme"
    third, third_headers = _twilio(_sms(phone, "Bye"), query=query, algorithm="HMAC_SHA256")
    answer = send(stack, "twilio", third, third_headers, query=query, content_type=FORM)
    assert answer.status_code == 200, answer.text
    # And all three are applied to the sender's phone, once each
    applied(stack, f"phone:{phone}", {"last_message": "Bye", "messages": 3})
    # When a message is forged: another token, a changed body, no signature, a signature
    # of another URL
    params = _sms(phone, "forged")
    forged, forged_headers = _twilio(params)
    other_url = RequestValidator(TWILIO_TOKEN).compute_signature(
        "https://elsewhere.example.com/webhooks/twilio", params
    )
    refused_changes_nothing(
        stack,
        {
            "wrong token": lambda: send(
                stack, "twilio", *_twilio(params, token="not-the-token"), content_type=FORM
            ),
            "tampered": lambda: send(
                stack,
                "twilio",
                forged.replace(b"forged", b"FORGED"),
                forged_headers,
                content_type=FORM,
            ),
            "no signature": lambda: send(stack, "twilio", forged, {}, content_type=FORM),
            "another URL": lambda: send(
                stack, "twilio", forged, {"X-Twilio-Signature": other_url}, content_type=FORM
            ),
        },
    )


# -- Slack --------------------------------------------------------------------------------


def _slack(
    payload: dict[str, object], at: int | None = None, secret: str = SLACK_SECRET
) -> tuple[bytes, dict[str, str]]:
    """A Slack Events API request, signed by slack_sdk's SignatureVerifier."""
    body = json.dumps(payload).encode()
    timestamp = str(at or int(time.time()))
    signature = SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body)
    assert signature is not None
    return body, {"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": signature}


def _mention(user: str, text: str) -> dict[str, object]:
    return {
        "token": "XXYYZZ",
        "team_id": "T123ABC456",
        "api_app_id": "A123ABC456",
        "event": {
            "type": "app_mention",
            "user": user,
            "text": text,
            "ts": "1705283400.000016",
            "channel": "C123ABC456",
            "event_ts": "1705283400.000016",
        },
        "type": "event_callback",
        "event_id": _unique("Ev"),
        "event_time": 1705283400,
    }


def test_slack_events_signed_by_slack_sdk(stack: Stack) -> None:
    # Given the signed url_verification Slack sends when the Request URL is saved
    challenge = "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    handshake = {"token": "Jhj5dZrVaK7ZwHHjRyZWjbDl", "challenge": challenge}
    body, headers = _slack({**handshake, "type": "url_verification"})
    before = settled(stack)
    answer = send(stack, "slack", body, headers)
    # Then the challenge is echoed and nothing is recorded
    assert answer.status_code == 200
    assert answer.json() == {"challenge": challenge}
    # And one signed with another secret is not answered
    forged_body, forged_headers = _slack({**handshake, "type": "url_verification"}, secret="x")
    assert send(stack, "slack", forged_body, forged_headers).status_code == 401
    assert settled(stack) == before
    # When an app_mention arrives, then Slack's retry of it: the same event, signed anew a
    # minute later, with X-Slack-Retry-Num and X-Slack-Retry-Reason
    user = _unique("U")
    event = _mention(user, "<@U0LAN0Z89> is it everything a river should be?")
    body, headers = _slack(event)
    assert send(stack, "slack", body, headers).status_code == 202
    retry_body, retry_headers = _slack(event, at=int(time.time()) + 60)
    retry_headers |= {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}
    assert retry_headers["X-Slack-Signature"] != headers["X-Slack-Signature"]
    assert replayed(send(stack, "slack", retry_body, retry_headers))
    # Then it is applied to the user's record once
    applied(
        stack,
        f"slack-user:{user}",
        {"last_text": "<@U0LAN0Z89> is it everything a river should be?", "mentions": 1},
    )
    # And a forged event, a stale one or one without a signature records nothing
    other = _mention(user, "forged")
    body, headers = _slack(other)
    refused_changes_nothing(
        stack,
        {
            "wrong secret": lambda: send(stack, "slack", *_slack(other, secret="other")),
            "tampered": lambda: send(stack, "slack", body.replace(b"forged", b"FORGED"), headers),
            "stale": lambda: send(stack, "slack", *_slack(other, at=int(time.time()) - 600)),
            "no signature": lambda: send(stack, "slack", body, {}),
        },
    )


# -- Zoom ---------------------------------------------------------------------------------


def _zoom(
    payload: dict[str, object], at: int | None = None, secret: str = ZOOM_SECRET
) -> tuple[bytes, dict[str, str]]:
    """A Zoom event signed as Zoom documents it: ``v0=`` hex HMAC-SHA256 of
    ``v0:{x-zm-request-timestamp}:{body}`` under the app's secret token."""
    body = json.dumps(payload).encode()
    timestamp = str(at or int(time.time()))
    message = f"v0:{timestamp}:".encode() + body
    digest = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
    return body, {
        "x-zm-request-timestamp": timestamp,
        "x-zm-signature": f"v0={digest}",
        "x-zm-trackingid": _unique("v="),
    }


def test_zoom_events_and_its_url_validation(stack: Stack) -> None:
    # Given Zoom's endpoint.url_validation, signed like any event
    plain = "qgg8vlvZRS6UYooatFL8Aw"
    validation = {
        "payload": {"plainToken": plain},
        "event_ts": 1654503849680,
        "event": "endpoint.url_validation",
    }
    before = settled(stack)
    answer = send(stack, "zoom", *_zoom(validation))
    # Then it is answered with the token and its HMAC under the secret token, recording nothing
    encrypted = hmac.new(ZOOM_SECRET.encode(), plain.encode(), hashlib.sha256).hexdigest()
    assert answer.status_code == 200
    assert answer.json() == {"plainToken": plain, "encryptedToken": encrypted}
    assert send(stack, "zoom", *_zoom(validation, secret="guess")).status_code == 401
    assert settled(stack) == before
    # When a meeting starts, and Zoom retries the event five minutes later (signed anew)
    meeting = str(uuid.uuid4().int)[:11]
    started = {
        "event": "meeting.started",
        "event_ts": 1626230691572,
        "payload": {
            "account_id": "AAAAAABBBB",
            "object": {
                "id": meeting,
                "uuid": "4444AAAiAAAAAiAiAiiAii==",
                "host_id": "x1yCzABCDEfg23HiJKl4mN",
                "topic": "Standup",
                "type": 2,
                "start_time": "2021-07-14T02:44:51Z",
                "timezone": "America/Denver",
            },
        },
    }
    assert send(stack, "zoom", *_zoom(started)).status_code == 202
    assert replayed(send(stack, "zoom", *_zoom(started, at=int(time.time()) + 300 - 10)))
    ended = {**started, "event": "meeting.ended", "event_ts": 1626232491572}
    assert send(stack, "zoom", *_zoom(ended)).status_code == 202
    # Then the meeting's record has both, once each
    applied(stack, f"meeting:{meeting}", {"status": "ended", "topic": "Standup"})
    body, headers = _zoom(started)
    refused_changes_nothing(
        stack,
        {
            "wrong secret": lambda: send(stack, "zoom", *_zoom(started, secret="guess")),
            "tampered": lambda: send(stack, "zoom", body.replace(b"Standup", b"Pwned"), headers),
            "no signature": lambda: send(stack, "zoom", body, {}),
        },
    )


# -- Meta ---------------------------------------------------------------------------------


def _meta(payload: dict[str, object], secret: str = META_SECRET) -> tuple[bytes, dict[str, str]]:
    """A Graph API webhook delivery signed as Meta documents it: ``sha256=`` hex HMAC-SHA256
    of the body under the app secret."""
    body = json.dumps(payload).encode()
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return body, {"X-Hub-Signature-256": f"sha256={digest}"}


def _leadgen(page: str, lead: str, form: str) -> dict[str, object]:
    return {
        "field": "leadgen",
        "value": {
            "ad_id": "238490329042",
            "form_id": form,
            "leadgen_id": lead,
            "created_time": 1603921811,
            "page_id": page,
            "adgroup_id": "238490329041",
        },
    }


def _page_entries(*entries: tuple[str, list[dict[str, object]]], at: int) -> dict[str, object]:
    return {
        "object": "page",
        "entry": [{"id": page, "time": at, "changes": changes} for page, changes in entries],
    }


def test_meta_verification_get(stack: Stack) -> None:
    before = settled(stack)
    # Given the GET Meta sends when the callback URL is saved
    query = urlencode(
        {
            "hub.mode": "subscribe",
            "hub.challenge": "1158201444",
            "hub.verify_token": META_VERIFY_TOKEN,
        }
    )
    answer = get(stack, "leads", query)
    # Then the challenge comes back as it was sent
    assert answer.status_code == 200
    assert answer.text == "1158201444"
    # And with another verify token it is refused, recording nothing
    wrong = query.replace(META_VERIFY_TOKEN, "guessed")
    assert get(stack, "leads", wrong).status_code == 403
    assert settled(stack) == before


def test_meta_lead_ads_batched_leads_each_applied(stack: Stack) -> None:
    leads = [_unique("44") for _ in range(3)]
    # Given one delivery of three leads on two pages (entry[].changes[])
    first = _page_entries(
        ("1001", [_leadgen("1001", leads[0], "form-a"), _leadgen("1001", leads[1], "form-a")]),
        ("1002", [_leadgen("1002", leads[2], "form-b")]),
        at=1603921812,
    )
    answer = send(stack, "leads", *_meta(first))
    # Then each lead is an event of its own, applied to its own record, with its page
    assert answer.status_code == 202, answer.text
    assert [item["status"] for item in answer.json()["items"]] == ["accepted"] * 3
    applied(stack, f"lead:{leads[0]}", {"form": "form-a", "page": "1001"})
    applied(stack, f"lead:{leads[1]}", {"form": "form-a", "page": "1001"})
    applied(stack, f"lead:{leads[2]}", {"form": "form-b", "page": "1002"})
    # When Meta retries them re-batched (sent later: entry[].time is the send time) with
    # the second lead alone, then the others together
    retries = [
        _page_entries(("1001", [_leadgen("1001", leads[1], "form-a")]), at=1603925412),
        _page_entries(
            ("1002", [_leadgen("1002", leads[2], "form-b")]),
            ("1001", [_leadgen("1001", leads[0], "form-a")]),
            at=1603929012,
        ),
    ]
    # Then each is a duplicate of every lead it carries
    for retry in retries:
        again = send(stack, "leads", *_meta(retry))
        assert replayed(again), again.text
        assert all(_repeat(item) for item in again.json()["items"])
    assert settled(stack)[1]["duplicate_deliveries"] >= 3
    applied(stack, f"lead:{leads[0]}", {"form": "form-a", "page": "1001"})
    # And a forged delivery records nothing
    body, headers = _meta(first)
    refused_changes_nothing(
        stack,
        {
            "wrong secret": lambda: send(stack, "leads", *_meta(first, secret="other")),
            "tampered": lambda: send(stack, "leads", body.replace(b"form-a", b"form-z"), headers),
            "no signature": lambda: send(stack, "leads", body, {}),
        },
    )


def _whatsapp(sender: str, name: str, text: str) -> dict[str, object]:
    return {
        "field": "messages",
        "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550001111", "phone_number_id": "1234"},
            "contacts": [{"profile": {"name": name}, "wa_id": sender}],
            "messages": [
                {
                    "from": sender,
                    "id": _unique("wamid.HBgL"),
                    "timestamp": str(int(time.time())),
                    "type": "text",
                    "text": {"body": text},
                }
            ],
        },
    }


def test_whatsapp_messages_batched_and_retried(stack: Stack) -> None:
    ann, bob = "1555" + str(uuid.uuid4().int)[:7], "1556" + str(uuid.uuid4().int)[:7]
    changes = [
        _whatsapp(ann, "Ann", "Hi"),
        _whatsapp(bob, "Bob", "Hello"),
        _whatsapp(ann, "Ann", "?"),
    ]
    # Given three messages from two people in one delivery
    delivery = {
        "object": "whatsapp_business_account",
        "entry": [{"id": "102290129340398", "changes": changes}],
    }
    answer = send(stack, "whatsapp", *_meta(delivery))
    assert answer.status_code == 202, answer.text
    # When Meta delivers them again, one per delivery
    for change in changes:
        retry = {**delivery, "entry": [{"id": "102290129340398", "changes": [change]}]}
        assert replayed(send(stack, "whatsapp", *_meta(retry)))
    # Then each message is applied once, to its sender's record, in order
    applied(stack, f"wa:{ann}", {"last_message": "?", "name": "Ann", "messages": 2})
    applied(stack, f"wa:{bob}", {"last_message": "Hello", "name": "Bob", "messages": 1})


# -- Asana --------------------------------------------------------------------------------


def _asana(payload: dict[str, object], secret: str) -> tuple[bytes, dict[str, str]]:
    """An Asana delivery: ``X-Hook-Signature`` = hex HMAC-SHA256 of the body under the
    secret its handshake handed over."""
    body = json.dumps(payload).encode()
    return body, {"X-Hook-Signature": hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()}


def _task_changed(task: str, field: str, at: str) -> dict[str, object]:
    return {
        "user": {"gid": "1123", "resource_type": "user"},
        "created_at": at,
        "action": "changed",
        "resource": {"gid": task, "resource_type": "task", "resource_subtype": "default_task"},
        "parent": None,
        "change": {"field": field, "action": "changed"},
    }


def _forget_kept_secret(stack: Stack, source: str) -> None:
    """What ``keylane sources forget-secret`` does, without starting a process for it."""
    client = redis.Redis.from_url(stack.settings.redis_dsn())
    client.delete(stack.settings.keys.hook_secret(source))
    client.close()


def test_asana_handshake_then_signed_events(stack: Stack) -> None:
    secret = hashlib.sha256(uuid.uuid4().bytes).hexdigest()
    try:
        # Given the handshake Asana sends while a webhook is created: X-Hook-Secret, and
        # neither a body nor a media type (developers.asana.com, "Establish a webhook")
        before = settled(stack)
        answer = send(stack, "asana", b"", {"X-Hook-Secret": secret}, content_type=None)
        # Then the secret is echoed (the webhook is established) and nothing is recorded
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-hook-secret"] == secret
        # And Asana's heartbeat, signed with it and without events, records nothing either
        assert send(stack, "asana", *_asana({"events": []}, secret)).status_code == 200
        assert settled(stack) == before
        # When Asana sends changes of two tasks, signed with that secret, then retries them
        # one by one
        task, other_task = (str(uuid.uuid4().int)[:16] for _ in range(2))
        events = [
            _task_changed(task, "assignee", "2024-05-01T10:00:00.000Z"),
            _task_changed(other_task, "name", "2024-05-01T10:00:00.500Z"),
            _task_changed(task, "due_on", "2024-05-01T10:00:01.000Z"),
        ]
        assert send(stack, "asana", *_asana({"events": events}, secret)).status_code == 202
        for event in events:
            assert replayed(send(stack, "asana", *_asana({"events": [event]}, secret)))
        # Then each is applied to its task's record, once
        applied(stack, f"task:{task}", {"changed": ["assignee", "due_on"], "changes": 2})
        applied(stack, f"task:{other_task}", {"changed": ["name"], "changes": 1})
        # And a delivery signed with any other secret, or unsigned, records nothing
        body, headers = _asana({"events": events}, secret)
        refused_changes_nothing(
            stack,
            {
                "wrong secret": lambda: send(stack, "asana", *_asana({"events": events}, "guess")),
                "tampered": lambda: send(
                    stack, "asana", body.replace(b"due_on", b"notes"), headers
                ),
                "no signature": lambda: send(stack, "asana", body, {}),
            },
        )
        # And a second webhook's handshake is refused while the first one's secret is kept
        other = hashlib.sha256(uuid.uuid4().bytes).hexdigest()
        refused = send(stack, "asana", b"", {"X-Hook-Secret": other}, content_type=None)
        assert refused.status_code == 409
        assert refused.json()["error"] == "secret_kept"
        # Until an operator forgets it: then the new webhook's handshake is answered, and
        # its deliveries verify with its own secret, no longer with the old one
        forgot = stack.keylane("sources", "forget-secret", "asana")
        assert forgot.returncode == 0, forgot.stderr
        later = {"events": [_task_changed(task, "notes", "2024-05-01T11:00:00.000Z")]}
        assert send(stack, "asana", *_asana(later, secret)).status_code == 401
        answer = send(stack, "asana", b"", {"X-Hook-Secret": other}, content_type=None)
        assert answer.status_code == 200
        assert answer.headers["x-hook-secret"] == other
        assert send(stack, "asana", *_asana(later, secret)).status_code == 401
        assert send(stack, "asana", *_asana(later, other)).status_code == 202
        applied(stack, f"task:{task}", {"changed": ["assignee", "due_on", "notes"], "changes": 3})
    finally:
        _forget_kept_secret(stack, "asana")


@pytest.mark.slow  # a second receiver
def test_asana_secret_kept_and_forgotten_for_every_receiver(stack: Stack) -> None:
    # Given two receivers of one deployment (behind one load balancer)
    first = stack.url
    second_proc = stack.receiver()
    second, stack.url = stack.url, first
    old, new = (hashlib.sha256(uuid.uuid4().bytes).hexdigest() for _ in range(2))
    task = str(uuid.uuid4().int)[:16]
    events = [_task_changed(task, f"field_{n}", f"2024-05-01T10:00:0{n}.000Z") for n in range(4)]
    try:
        # When a webhook's handshake reaches the first, its events both
        handshake = send(stack, "asana", b"", {"X-Hook-Secret": old}, content_type=None)
        assert handshake.status_code == 200
        for event, receiver in zip(events[:2], (first, second), strict=True):
            answer = send(stack, "asana", *_asana({"events": [event]}, old), receiver=receiver)
            # Then each verifies with the secret the first one kept
            assert answer.status_code == 202, answer.text
        # When an operator forgets that secret
        assert stack.keylane("sources", "forget-secret", "asana").returncode == 0
        # Then neither receiver takes a delivery signed with it any more
        for receiver in (first, second):
            late = send(stack, "asana", *_asana({"events": [events[2]]}, old), receiver=receiver)
            assert late.status_code == 401, late.text
        # And once a new webhook's handshake reaches the second, both verify with its secret
        handshake = send(
            stack, "asana", b"", {"X-Hook-Secret": new}, content_type=None, receiver=second
        )
        assert handshake.status_code == 200
        for event, receiver in zip(events[2:], (first, second), strict=True):
            answer = send(stack, "asana", *_asana({"events": [event]}, new), receiver=receiver)
            assert answer.status_code == 202, answer.text
        changed = [f"field_{n}" for n in range(4)]
        applied(stack, f"task:{task}", {"changed": changed, "changes": 4})
    finally:
        second_proc.stop()
        _forget_kept_secret(stack, "asana")


# -- Microsoft Graph ----------------------------------------------------------------------


def _notification(message: str, change: str, state: str = GRAPH_STATE) -> dict[str, object]:
    return {
        "id": _unique("lsgTZMr9KwAAA"),
        "subscriptionId": "7f105c7d-2dc5-4530-97cd-4e7ae6534c07",
        "subscriptionExpirationDateTime": "2024-05-03T11:00:00.0000000Z",
        "clientState": state,
        "changeType": change,
        "resource": f"Users/ada/Messages/{message}",
        "tenantId": "84bd8158-6d4d-4958-8b9f-9d6445542f95",
        "resourceData": {
            "@odata.type": "#Microsoft.Graph.Message",
            "@odata.id": f"Users/ada/Messages/{message}",
            "@odata.etag": 'W/"CQAAABYAAAD"',
            "id": message,
        },
    }


def test_microsoft_graph_validation_and_notifications(stack: Stack) -> None:
    # Given Graph's validation of the notification URL: a POST with ?validationToken=,
    # text/plain and no body
    token = "Validation: Testing client application reachability for subscription Request-Id: 1"
    before = settled(stack)
    answer = send(
        stack,
        "graph",
        b"",
        {},
        query=urlencode({"validationToken": token}),
        content_type="text/plain; charset=utf-8",
    )
    # Then the decoded token comes back as text/plain, recording nothing
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    assert answer.text == token
    assert settled(stack) == before
    # When a collection of two notifications arrives, then Graph retries it re-batched
    message = _unique("AAMkAGUwNjQ4ZjIx")
    created, updated = _notification(message, "created"), _notification(message, "updated")
    assert (
        send(stack, "graph", json.dumps({"value": [created, updated]}).encode(), {}).status_code
        == 202
    )
    for retry in ([updated], [created], [updated, created]):
        again = send(stack, "graph", json.dumps({"value": retry}).encode(), {})
        assert replayed(again), again.text
    # Then both are applied to the message's record, once each, in order
    applied(
        stack,
        f"message:{message}",
        {"state": "updated", "resource": f"Users/ada/Messages/{message}"},
    )
    # And a collection with any clientState not the subscription's records nothing
    strange = _notification(message, "updated", state="guessed")
    refused_changes_nothing(
        stack,
        {
            "wrong clientState": lambda: send(
                stack, "graph", json.dumps({"value": [created, strange]}).encode(), {}
            ),
            "no clientState": lambda: send(
                stack,
                "graph",
                json.dumps(
                    {"value": [{k: v for k, v in created.items() if k != "clientState"}]}
                ).encode(),
                {},
            ),
        },
    )

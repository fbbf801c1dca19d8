"""CRM senders as they send (issue 47): HubSpot (v3 signatures, and v2 and v1), Salesforce
outbound messages, Pipedrive and Intercom, each delivery built and signed by the
provider's own SDK where there is one (``hubspot-api-client``), else by its published
recipe (/work/notes/providers.md names the sources), through a real receiver and worker:
every item applied to its own record, a retry (as the provider changes it) a duplicate,
never ``id_reused``, a forgery a 401 that records nothing, and the answer it expects."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator

import pytest
from hubspot.utils.signature import Signature

from tests.support.senders import (
    PUBLIC_URL,
    applied,
    refused_changes_nothing,
    replayed,
    send,
    sender_deployment,
    settled,
)
from tests.support.stack import Stack

HUBSPOT_SECRET = "hubspot-client-secret-7f3a9c"
PIPEDRIVE_AUTH = "keylane:pipedrive-hook-password"
INTERCOM_SECRET = "intercom-client-secret-19b2"
ORG_ID = "00D5e000000KQ2eEAG"
SECRETS = {
    "HUBSPOT_CLIENT_SECRET": HUBSPOT_SECRET,
    "PIPEDRIVE_WEBHOOK_AUTH": PIPEDRIVE_AUTH,
    "INTERCOM_CLIENT_SECRET": INTERCOM_SECRET,
}

_HUBSPOT_MAPPING = """
format = "mapped"
record_key = "contact:{body:objectId}"
on."contact.creation" = {created_at = {set = "body:occurredAt"}}
on."contact.propertyChange".changed = {append = "body:propertyName"}
on."contact.propertyChange".last = {set = "body:propertyValue"}
"""

SOURCES = f"""
[sources.hubspot]
verify = {{scheme = "hubspot", secrets_env = ["HUBSPOT_CLIENT_SECRET"]}}
{_HUBSPOT_MAPPING}

[sources.hubspot_v2]
verify = {{scheme = "hubspot_v2", secrets_env = ["HUBSPOT_CLIENT_SECRET"]}}
{_HUBSPOT_MAPPING}

[sources.hubspot_v1]
verify = {{scheme = "hubspot_v1", secrets_env = ["HUBSPOT_CLIENT_SECRET"]}}
{_HUBSPOT_MAPPING}

[sources.salesforce]
verify = {{scheme = "salesforce", organization_id = "{ORG_ID}"}}
format = "mapped"
record_key = "sf:{{body:sObject.Id}}"
on."sf:Contact".email = {{set = "body:sObject.Email"}}
on."sf:Contact".org = {{set = "delivery:Envelope.Body.notifications.OrganizationId"}}

[sources.pipedrive]
verify = {{scheme = "pipedrive", secrets_env = ["PIPEDRIVE_WEBHOOK_AUTH"]}}
format = "mapped"
record_key = "deal:{{body:meta.entity_id}}"
on."deal.create" = {{title = {{set = "body:data.title"}}, value = {{set = "body:data.value"}}}}
on."deal.change" = {{value = {{set = "body:data.value"}}, changes = {{increment = 1}}}}

[sources.intercom]
verify = {{scheme = "intercom", secrets_env = ["INTERCOM_CLIENT_SECRET"]}}
format = "mapped"
record_key = "contact:{{body:data.item.id}}"
on."contact.user.created" = {{email = {{set = "body:data.item.email"}}}}
on."contact.email.updated".email = {{set = "body:data.item.email"}}
on."contact.email.updated".email_changes = {{increment = 1}}
"""


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The module's deployment (each test uses records of its own)."""
    with sender_deployment(redis_url, tmp_path_factory.mktemp("crm"), SOURCES, SECRETS) as running:
        yield running


def _number() -> int:
    return int(str(uuid.uuid4().int)[:9])


# -- HubSpot ------------------------------------------------------------------------------


def _hubspot(
    events: list[dict[str, object]],
    version: str,
    source: str,
    at_ms: int | None = None,
    secret: str = HUBSPOT_SECRET,
) -> tuple[bytes, dict[str, str]]:
    """A HubSpot delivery (a JSON array of events) signed by hubspot-api-client's
    Signature.get_signature: v3 over method, URL, body and a millisecond timestamp; v2 and
    v1 the SHA-256 of the secret and the request."""
    body = json.dumps(events)
    url = f"{PUBLIC_URL}/webhooks/{source}"
    timestamp = str(at_ms or int(time.time() * 1000))
    signature = Signature.get_signature(
        secret, body, version, http_uri=url, http_method="POST", timestamp=timestamp
    )
    if version == "v3":
        headers = {"X-HubSpot-Signature-v3": signature, "X-HubSpot-Request-Timestamp": timestamp}
    else:
        headers = {"X-HubSpot-Signature": signature, "X-HubSpot-Signature-Version": version}
    return body.encode(), headers


def _hubspot_event(
    event_id: int, kind: str, contact: int, name: str = "", value: str = ""
) -> dict[str, object]:
    event: dict[str, object] = {
        "eventId": event_id,
        "subscriptionId": 2417,
        "portalId": 62515,
        "appId": 123456,
        "occurredAt": 1710000000000 + event_id,
        "subscriptionType": kind,
        "attemptNumber": 0,
        "objectId": contact,
        "changeSource": "CRM_UI",
        "sourceId": "userId:1",
    }
    if name:
        event |= {"propertyName": name, "propertyValue": value}
    return event


def _retried(events: list[dict[str, object]], attempt: int) -> list[dict[str, object]]:
    return [{**event, "attemptNumber": attempt} for event in events]


@pytest.mark.parametrize(
    ("version", "source"), [("v3", "hubspot"), ("v2", "hubspot_v2"), ("v1", "hubspot_v1")]
)
def test_hubspot_batch_signed_by_the_hubspot_sdk(stack: Stack, version: str, source: str) -> None:
    ann, bob = _number(), _number()
    first = _number()
    # Given one delivery of four events about two contacts, signed by HubSpot's SDK
    events = [
        _hubspot_event(first, "contact.creation", ann),
        _hubspot_event(first + 1, "contact.propertyChange", ann, "email", "ann@example.com"),
        _hubspot_event(first + 2, "contact.creation", bob),
        _hubspot_event(first + 3, "contact.propertyChange", ann, "lifecyclestage", "lead"),
    ]
    answer = send(stack, source, *_hubspot(events, version, source))
    # Then every event is accepted, each applied to its own contact, in order
    assert answer.status_code == 202, answer.text
    assert [item["status"] for item in answer.json()["items"]] == ["accepted"] * 4
    applied(
        stack,
        f"contact:{ann}",
        {
            "created_at": 1710000000000 + first,
            "changed": ["email", "lifecyclestage"],
            "last": "lead",
        },
    )
    applied(stack, f"contact:{bob}", {"created_at": 1710000000000 + first + 2})
    # When HubSpot retries them: attemptNumber raised, signed anew a little later, and
    # re-batched (two with a new event, then the other two alone)
    later = int(time.time() * 1000) + 60_000
    new = _hubspot_event(first + 4, "contact.propertyChange", bob, "email", "bob@example.com")
    mixed = send(stack, source, *_hubspot([*_retried(events[:2], 1), new], version, source, later))
    alone = send(stack, source, *_hubspot(_retried(events[2:], 2), version, source, later + 1))
    # Then the events seen before are duplicates, never a reused id, and the new one is applied
    assert mixed.status_code == 202, mixed.text
    statuses = [item["status"] for item in mixed.json()["items"]]
    assert statuses[2] == "accepted"
    assert "reused" not in statuses
    assert replayed(alone), alone.text
    applied(
        stack,
        f"contact:{bob}",
        {"created_at": 1710000000000 + first + 2, "changed": ["email"], "last": "bob@example.com"},
    )
    assert settled(stack)[1].get("reused_ids", 0) == 0
    # And a forged, tampered or unsigned delivery records nothing
    body, headers = _hubspot(events, version, source)
    forged = {
        "wrong secret": lambda: send(
            stack, source, *_hubspot(events, version, source, secret="guess")
        ),
        "tampered": lambda: send(stack, source, body.replace(b"lead", b"customer"), headers),
        "no signature": lambda: send(stack, source, body, {}),
    }
    if version != "v1":  # v1 signs the body only
        forged["signed for another URL"] = lambda: send(
            stack, source, *_hubspot(events, version, "elsewhere")
        )
    refused_changes_nothing(stack, forged)


def test_hubspot_v3_refuses_a_stale_timestamp(stack: Stack) -> None:
    events = [_hubspot_event(_number(), "contact.creation", _number())]
    stale = int(time.time() * 1000) - 10 * 60 * 1000
    refused_changes_nothing(
        stack, {"stale": lambda: send(stack, "hubspot", *_hubspot(events, "v3", "hubspot", stale))}
    )


# -- Salesforce ---------------------------------------------------------------------------


def _notification(notification: str, contact: str, email: str) -> str:
    return f"""
   <Notification>
    <Id>{notification}</Id>
    <sObject xsi:type="sf:Contact" xmlns:sf="urn:sobject.enterprise.soap.sforce.com">
     <sf:Id>{contact}</sf:Id>
     <sf:Email>{email}</sf:Email>
     <sf:LastModifiedDate>2024-05-01T10:00:00.000Z</sf:LastModifiedDate>
    </sObject>
   </Notification>"""


def _outbound_message(*notifications: str, org: str = ORG_ID) -> bytes:
    """A Salesforce outbound message as its WSDL and real captures show it: SOAP 1.1,
    several notifications in one message."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"
    xmlns:xsd="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
 <soapenv:Body>
  <notifications xmlns="http://soap.sforce.com/2005/09/outbound">
   <OrganizationId>{org}</OrganizationId>
   <ActionId>04k5e000000CaRkAAK</ActionId>
   <SessionId xsi:nil="true"/>
   <EnterpriseUrl>https://acme.my.salesforce.com/services/Soap/c/59.0/00D5e000000KQ2e</EnterpriseUrl>
   <PartnerUrl>https://acme.my.salesforce.com/services/Soap/u/59.0/00D5e000000KQ2e</PartnerUrl>{"".join(notifications)}
  </notifications>
 </soapenv:Body>
</soapenv:Envelope>""".encode()


SOAP = "text/xml; charset=utf-8"
SOAP_ACTION = {"SOAPAction": '""'}
ACK = "<Ack>true</Ack>"


def _salesforce_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:15].upper()


def test_salesforce_notifications_acknowledged_once_queued(stack: Stack) -> None:
    ids = [_salesforce_id("04l") for _ in range(3)]
    contacts = [_salesforce_id("003") for _ in range(2)]
    notes = [
        _notification(ids[0], contacts[0], "ann@example.com"),
        _notification(ids[1], contacts[1], "bob@example.com"),
        _notification(ids[2], contacts[0], "ann@newmail.example.com"),
    ]
    # Given an outbound message of three notifications about two contacts
    answer = send(stack, "salesforce", _outbound_message(*notes), SOAP_ACTION, content_type=SOAP)
    # Then Salesforce gets its SOAP acknowledgement, as XML
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/xml")
    assert ACK in answer.text
    assert "http://soap.sforce.com/2005/09/outbound" in answer.text
    # And each notification is applied to its own contact, in order
    applied(stack, f"sf:{contacts[0]}", {"email": "ann@newmail.example.com", "org": ORG_ID})
    applied(stack, f"sf:{contacts[1]}", {"email": "bob@example.com", "org": ORG_ID})
    # When Salesforce retries the message, re-batched, with the record's values of now
    # (it builds the message when it sends it): each notification is a duplicate
    newer = [_notification(ids[1], contacts[1], "bob@later.example.com"), notes[0]]
    retry = send(stack, "salesforce", _outbound_message(*newer), SOAP_ACTION, content_type=SOAP)
    assert retry.status_code == 200, retry.text
    assert ACK in retry.text
    assert retry.headers["keylane-replayed"] == "true"
    assert settled(stack)[1].get("reused_ids", 0) == 0
    applied(stack, f"sf:{contacts[1]}", {"email": "bob@example.com", "org": ORG_ID})
    # And a message from another org, or that is no outbound message, records nothing and
    # gets no acknowledgement
    other_org = _outbound_message(
        _notification(_salesforce_id("04l"), contacts[0], "x@y.z"), org="00D000000000001AAA"
    )
    refused_changes_nothing(
        stack,
        {
            "another org": lambda: send(
                stack, "salesforce", other_org, SOAP_ACTION, content_type=SOAP
            ),
            "no org": lambda: send(
                stack,
                "salesforce",
                b"<notifications><Notification><Id>1</Id></Notification></notifications>",
                SOAP_ACTION,
                content_type=SOAP,
            ),
        },
    )


@pytest.mark.slow  # a second receiver
def test_salesforce_gets_no_ack_when_its_notifications_cannot_be_queued(stack: Stack) -> None:
    # Given a receiver of the deployment that cannot reach Redis
    url = stack.url
    down = stack.receiver(redis_url="redis://127.0.0.1:9/0")
    unreachable, stack.url = stack.url, url
    try:
        notes = [_notification(_salesforce_id("04l"), _salesforce_id("003"), "ann@example.com")]
        # When Salesforce sends it an outbound message
        answer = send(
            stack,
            "salesforce",
            _outbound_message(*notes),
            SOAP_ACTION,
            content_type=SOAP,
            receiver=unreachable,
        )
        # Then it answers 503 with Retry-After, never an acknowledgement: Salesforce keeps
        # the message and sends it again
        assert answer.status_code == 503, answer.text
        assert "retry-after" in answer.headers
        assert "Ack" not in answer.text
    finally:
        down.stop()


# -- Pipedrive ----------------------------------------------------------------------------


def _pipedrive(
    deal: int, action: str, value: int, attempt: int = 1, event: str | None = None
) -> dict[str, object]:
    """A Pipedrive webhook v2 delivery, as its guide shows it."""
    return {
        "meta": {
            "action": action,
            "entity": "deal",
            "version": "2.0",
            "company_id": 12882925,
            "user_id": 18487521,
            "id": event or str(uuid.uuid4()),
            "correlation_id": str(uuid.uuid4()),
            "entity_id": str(deal),
            "webhook_id": "99",
            "webhook_owner_id": "18487521",
            "attempt": attempt,
            "host": "company.pipedrive.com",
            "timestamp": "2024-09-27T14:25:28.000Z",
            "change_source": "app",
            "is_bulk_edit": False,
            "type": "general",
        },
        "data": {"id": deal, "title": "Big deal", "value": value, "currency": "USD"},
        "previous": None if action == "create" else {"value": value - 1},
    }


def _basic(credentials: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(credentials.encode()).decode()}


def test_pipedrive_with_http_basic_credentials(stack: Stack) -> None:
    deal = _number()
    created, changed = _pipedrive(deal, "create", 100), _pipedrive(deal, "change", 250)
    auth = _basic(PIPEDRIVE_AUTH)
    # Given a deal created and changed, sent with the webhook's HTTP Basic credentials
    for delivery in (created, changed):
        answer = send(stack, "pipedrive", json.dumps(delivery).encode(), auth)
        assert answer.status_code == 202, answer.text
    # When Pipedrive retries the change: meta.attempt raised, the rest as it was
    retry = json.loads(json.dumps(changed))
    retry["meta"]["attempt"] = 2
    # Then it is a duplicate, not a reused id
    assert replayed(send(stack, "pipedrive", json.dumps(retry).encode(), auth))
    applied(stack, f"deal:{deal}", {"title": "Big deal", "value": 250, "changes": 1})
    # And a wrong password, another user, or no credentials is a 401 that records nothing
    body = json.dumps(_pipedrive(deal, "change", 999)).encode()
    user = PIPEDRIVE_AUTH.partition(":")[0]
    refused_changes_nothing(
        stack,
        {
            "wrong password": lambda: send(stack, "pipedrive", body, _basic(f"{user}:guess")),
            "another user": lambda: send(
                stack, "pipedrive", body, _basic("admin:" + PIPEDRIVE_AUTH)
            ),
            "no credentials": lambda: send(stack, "pipedrive", body, {}),
            "a bearer token": lambda: send(
                stack, "pipedrive", body, {"Authorization": "Bearer " + PIPEDRIVE_AUTH}
            ),
        },
    )


# -- Intercom -----------------------------------------------------------------------------


def _intercom(
    payload: dict[str, object], secret: str = INTERCOM_SECRET
) -> tuple[bytes, dict[str, str]]:
    """An Intercom notification signed as Intercom documents it: ``X-Hub-Signature:
    sha1=`` hex HMAC-SHA1 of the body under the app's client secret."""
    body = json.dumps(payload).encode()
    digest = hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()
    return body, {"X-Hub-Signature": f"sha1={digest}"}


def _intercom_notification(
    topic: str, contact: str, email: str, attempts: int = 1
) -> dict[str, object]:
    return {
        "type": "notification_event",
        "app_id": "abc123",
        "id": f"notif_{uuid.uuid4()}",
        "topic": topic,
        "delivery_status": "pending",
        "delivery_attempts": attempts,
        "delivered_at": 0,
        "first_sent_at": 1410188629,
        "created_at": 1410188628,
        "self": None,
        "links": {},
        "data": {
            "type": "notification_event_data",
            "item": {"type": "contact", "id": contact, "email": email, "role": "user"},
        },
    }


def test_intercom_notifications_and_their_retries(stack: Stack) -> None:
    # Given the ping Intercom sends when a webhook is tested or subscribed: answered 2xx,
    # recording nothing (the source maps nothing for its topic)
    before = settled(stack)
    ping = {
        **_intercom_notification("ping", "", ""),
        "data": {"type": "notification_event_data", "item": {"type": "ping", "message": "hi"}},
    }
    answer = send(stack, "intercom", *_intercom(ping))
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "ignored"
    assert settled(stack) == before
    contact = uuid.uuid4().hex[:24]
    created = _intercom_notification("contact.user.created", contact, "ann@example.com")
    updated = _intercom_notification("contact.email.updated", contact, "ann@new.example.com")
    for notification in (created, updated):
        assert send(stack, "intercom", *_intercom(notification)).status_code == 202
    # When Intercom retries the update: delivery_attempts raised, a delivery status and time
    retry = {
        **updated,
        "delivery_attempts": 2,
        "delivery_status": "retry",
        "delivered_at": 1410188690,
    }
    # Then it is a duplicate (its signature differs: it signs the body)
    assert replayed(send(stack, "intercom", *_intercom(retry)))
    applied(stack, f"contact:{contact}", {"email": "ann@new.example.com", "email_changes": 1})
    body, headers = _intercom(updated)
    refused_changes_nothing(
        stack,
        {
            "wrong secret": lambda: send(stack, "intercom", *_intercom(updated, secret="guess")),
            "tampered": lambda: send(stack, "intercom", body.replace(b"new.", b"evil."), headers),
            "sha256 instead": lambda: send(
                stack,
                "intercom",
                body,
                {
                    "X-Hub-Signature": "sha256="
                    + hmac.new(INTERCOM_SECRET.encode(), body, hashlib.sha256).hexdigest()
                },
            ),
            "no signature": lambda: send(stack, "intercom", body, {}),
        },
    )

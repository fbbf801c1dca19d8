"""What the receiver answers: keylane's JSON answers (accepted, duplicate, ignored, an
error, a told outcome; one per item for a batched delivery), and the bodies some senders
expect instead in a 2xx (Salesforce's SOAP acknowledgement, Twilio's empty TwiML).

A sender's own answer replaces keylane's JSON only in a 2xx, that is once every event of
the delivery is durably queued (or was before): Salesforce retries a message until it is
acknowledged, so its ``<Ack>true</Ack>`` must never be sent for one that is not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import msgspec
from starlette.responses import Response

from ..routing.contract.outcomes import http_status_of, outcome_path
from ..routing.contract.presets import Reply

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

JSON = b"application/json"
_ENCODE = msgspec.json.Encoder().encode
REPLAYED = (b"keylane-replayed", b"true")

#: The bodies a sender expects in a 2xx instead of keylane's JSON, with their media type.
REPLIES: dict[Reply, tuple[bytes, bytes]] = {
    # Salesforce: a notificationsResponse acknowledging every notification of the message.
    "salesforce_ack": (
        b'<?xml version="1.0" encoding="UTF-8"?>'
        b'<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/">'
        b"<soapenv:Body>"
        b'<notificationsResponse xmlns="http://soap.sforce.com/2005/09/outbound">'
        b"<Ack>true</Ack></notificationsResponse>"
        b"</soapenv:Body></soapenv:Envelope>",
        b"text/xml; charset=utf-8",
    ),
    # Twilio: TwiML that does nothing (no reply message, no call instruction).
    "twiml": (
        b'<?xml version="1.0" encoding="UTF-8"?><Response/>',
        b"text/xml; charset=utf-8",
    ),
}


class Answer:
    """An HTTP answer: status, body (JSON unless ``content_type`` says otherwise) and
    extra headers."""

    __slots__ = ("body", "code", "content_type", "headers", "status", "told")

    def __init__(
        self,
        status: int,
        body: bytes,
        headers: list[tuple[bytes, bytes]] | None = None,
        content_type: bytes = JSON,
    ) -> None:
        self.status = status
        self.body = body
        self.headers = headers or []
        self.content_type = content_type
        #: Whether the body is a told outcome (``routing/contract/outcomes.py``).
        self.told = False
        #: An error answer's code (``error_answer``), "" otherwise.
        self.code = ""

    async def send(self, send: Send) -> None:
        """Send it on an ASGI channel."""
        headers = [
            (b"content-type", self.content_type),
            (b"content-length", b"%d" % len(self.body)),
            *self.headers,
        ]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})

    def response(self) -> Response:
        """The same answer as a Starlette response (for the routes Starlette serves)."""
        headers = {k.decode(): v.decode() for k, v in self.headers}
        return Response(self.body, self.status, headers, media_type=self.content_type.decode())

    def as_reply(self, reply: Reply | None) -> Answer:
        """This answer with the sender's own body when it is a 2xx and the sender expects
        one (``reply``); as it is otherwise."""
        if reply is None or not 200 <= self.status < 300:
            return self
        body, content_type = REPLIES[reply]
        return Answer(200, body, self.headers, content_type)


def json_answer(status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None) -> Answer:
    """An answer whose body is ``body`` as JSON."""
    return Answer(status, _ENCODE(body), headers)


def text_answer(status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None) -> Answer:
    """A ``text/plain`` answer (a handshake's echo)."""
    return Answer(status, text.encode(), headers, b"text/plain; charset=utf-8")


def error_answer(status: int, code: str, detail: str, retry_after: int | None = None) -> Answer:
    """keylane's error body, with ``Retry-After`` when the sender should come back."""
    headers = [(b"retry-after", str(retry_after).encode())] if retry_after is not None else None
    answer = json_answer(status, {"error": code, "detail": detail}, headers)
    answer.code = code
    return answer


def ignored_answer(source: str, event_type: str, reason: str) -> Answer:
    """200 ``ignored``: the source maps nothing for this delivery."""
    body = {"status": "ignored", "source": source, "event_type": event_type, "reason": reason}
    return json_answer(200, body)


def told_answer(
    told: bytes | None, accepted: Answer, wait_s: int, source: str, event_id: str
) -> Answer:
    """The answer to a request that waited up to ``wait_s``: its told outcome, or (not
    known in time) the accept's answer as without waiting, with where to ask later."""
    applied = (b"preference-applied", b"wait=%d" % wait_s)
    if told is None:
        location = (b"location", outcome_path(source, event_id).encode())
        headers = [*accepted.headers, applied, location]
        return Answer(accepted.status, accepted.body, headers)
    answer = Answer(http_status_of(told), told, [*accepted.headers, applied])
    answer.told = True
    return answer


def batch_answer(source: str, items: Sequence[bytes], accepted: bool, replayed: bool) -> Answer:
    """The answer to a batched delivery taken whole: one JSON body per item, in order
    (each as a single delivery's answer would say it), 202 when any item was newly
    accepted, else 200 (and ``Keylane-Replayed`` when every item was seen before)."""
    status = b"accepted" if accepted else b"done"
    body = (
        b'{"status":"'
        + status
        + b'","source":'
        + _ENCODE(source)
        + b',"items":['
        + b",".join(items)
        + b"]}"
    )
    return Answer(202 if accepted else 200, body, [REPLAYED] if replayed else None)


def waited_batch_answer(source: str, items: Sequence[bytes], undecided: int, wait_s: int) -> Answer:
    """The answer to a batched delivery that waited up to ``wait_s`` for its items'
    outcomes: 200 when each is known (each item its told outcome), else 202 with the ones
    known told and the others as accepted, each with where to ask later."""
    status = b"pending" if undecided else b"decided"
    body = (
        b'{"status":"'
        + status
        + b'","source":'
        + _ENCODE(source)
        + b',"items":['
        + b",".join(items)
        + b"]}"
    )
    applied = (b"preference-applied", b"wait=%d" % wait_s)
    return Answer(202 if undecided else 200, body, [applied])


def reused_detail(event_id: str) -> str:
    """Why a reused id was refused (and what became of it)."""
    return (
        f"event id {event_id!r} was already delivered with a different body; "
        "this delivery was recorded for review and not applied"
    )

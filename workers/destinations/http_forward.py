"""A destination that POSTs each event to a URL: an n8n or Zapier webhook, any service.

The body is the delivery's body, byte for byte as it came (the event's ``body``; for an
event queued without one, its payload as compact JSON). Every call carries
``Idempotency-Key`` (the same on every retry and redelivery of the event), the Standard
Webhooks headers (``webhook-id`` = the idempotency key, ``webhook-timestamp``, and
``webhook-signature`` over those bytes when the destination has a ``secret_env``),
``Keylane-*`` headers naming the event, and the destination's own headers. The answer
decides the outcome:

* 2xx: done (the status and an excerpt of the body are kept);
* 429 or 503 with ``Retry-After``: wait that long, every worker (the destination pauses);
* other 5xx, 408, 429, time-outs, refused connections: retry with back-off and jitter;
* any other 4xx: the destination refuses the event: a dead letter with its answer.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Mapping
from typing import Any

import httpx

from ...routing.contract.destinations import EXCERPT_CHARS, DestinationConfig
from ...routing.contract.events import Event
from ...routing.contract.signing import standard_webhooks_signature, whsec_key
from . import (
    Blocking,
    Context,
    Destination,
    Done,
    GiveUp,
    Outcome,
    RetryLater,
)

#: The longest Retry-After keylane honours as asked; longer ones are cut to this.
MAX_RETRY_AFTER_S = 3600.0
RETRYABLE_4XX = (408, 425, 429)


class HttpForward(Destination):
    """POST to ``config.url`` (see the module docstring)."""

    give_up_reason = "rejected"

    def __init__(self, config: DestinationConfig, environ: Mapping[str, str]) -> None:
        super().__init__(config)
        assert config.url is not None
        self.url = config.url
        self._key = whsec_key(environ[config.secret_env]) if config.secret_env else None
        self._headers = {
            name: environ[value[4:]] if value.startswith("env:") else value
            for name, value in config.headers.items()
        }
        # Opened on the lanes' event loop at the first call (an async client is bound to it).
        self._client: httpx.AsyncClient | None = None

    async def call(self, event: Event, context: Context, blocking: Blocking) -> Outcome:
        """One POST, awaited on the lane's loop (waiting for the answer holds no thread);
        never raises for what the destination or the network does."""
        if self._client is None:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=100)
            self._client = httpx.AsyncClient(
                timeout=self.config.timeout_s, follow_redirects=False, limits=limits
            )
        body = forwarded_body(event)
        try:
            answer = await self._client.post(
                self.url,
                content=body,
                headers=self._request_headers(event, context, body),
                timeout=max(0.1, min(self.config.timeout_s, context.remaining_s)),
            )
        except httpx.TimeoutException:
            return RetryLater(f"no answer within {self.config.timeout_s:g}s")
        except httpx.HTTPError as exc:
            return RetryLater(f"{type(exc).__name__}: {exc}")
        return outcome_of(answer)

    def _request_headers(self, event: Event, context: Context, body: bytes) -> dict[str, str]:
        timestamp = int(time.time())
        headers = {
            **self._headers,
            "content-type": "application/json",
            "idempotency-key": context.idempotency_key,
            "webhook-id": context.idempotency_key,
            "webhook-timestamp": str(timestamp),
            "keylane-source": event.source,
            "keylane-event-id": event.event_id,
            "keylane-event-type": event.event_type,
            "keylane-record-key": event.record_key,
            "keylane-attempt": str(context.attempt),
        }
        if self._key is not None:
            headers["webhook-signature"] = standard_webhooks_signature(
                self._key, context.idempotency_key, timestamp, body
            )
        return headers

    def describe(self, event: Event, context: Context) -> dict[str, Any]:
        """Method, URL, header names (values may be secrets) and the body."""
        return {
            "method": "POST",
            "url": self.url,
            "headers": sorted({*self._headers, "idempotency-key", "webhook-id"}),
            "signed": self._key is not None,
            "idempotency_key": context.idempotency_key,
            "body": event.payload,
        }

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def forwarded_body(event: Event) -> bytes:
    """What a forward POSTs: the delivery's bytes as they came, so a signature the original
    sender made over them still verifies downstream, and keylane's own signature is made
    over these very bytes. An event queued before events carried their body is sent as
    its payload's compact JSON."""
    if event.body is not None:
        return event.body.encode()
    return json.dumps(event.payload, separators=(",", ":")).encode()


def outcome_of(answer: httpx.Response) -> Outcome:
    """The outcome an HTTP answer means (see the module docstring)."""
    status = answer.status_code
    excerpt = answer.text[:EXCERPT_CHARS]
    detail = f"HTTP {status}"
    if 200 <= status < 300:
        return Done(detail, status, excerpt, result={"status": status})
    retry_after = retry_after_s(answer.headers.get("retry-after"))
    if status in (429, 503) and retry_after is not None:
        return RetryLater(
            f"{detail}, Retry-After {retry_after:g}s", retry_after, True, status, excerpt
        )
    if status >= 500 or status in RETRYABLE_4XX:
        return RetryLater(detail, None, False, status, excerpt)
    return GiveUp(detail, status, excerpt)


def retry_after_s(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, min(MAX_RETRY_AFTER_S, seconds))

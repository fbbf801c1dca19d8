"""``GET /outcomes/{source}/{event_id}``: an event's told outcome, asked for later
(optionally waiting, ``Prefer: wait=N``), for whoever holds the outcomes token.

An outcome carries record data (the revision, the values an event wrote), so the route
is closed unless a token is configured (``KEYLANE_OUTCOMES_TOKEN``): without one it
answers 403 and says how to open it; with one, a request without the token, or with
another, gets 401. The token is compared in constant time.

Answers: the told outcome with its status (200 applied, 409 refused, 422 dead-lettered;
``routing/contract/outcomes.py``); 202 ``{"status": "pending"}`` while the event is
accepted (its dedupe mark is there) but not decided; 404 when keylane knows nothing of it
(never accepted, or past its retention).
"""

from __future__ import annotations

import hmac

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ..routing.contract.errors import BrokerUnavailable
from ..routing.contract.outcomes import (
    PENDING_STATUS,
    http_status_of,
    pending_body,
    preferred_wait_s,
)
from ..routing.contract.settings import Settings
from .gateway import ReceiverGateway
from .outcome_waits import OutcomeWaits

OUTCOME_ROUTE = "/outcomes/{source}/{event_id:path}"
_ENCODE = msgspec.json.Encoder().encode
_JSON = "application/json"


class OutcomeReads:
    """The outcomes route (see the module docstring)."""

    def __init__(self, settings: Settings, gateway: ReceiverGateway, waits: OutcomeWaits) -> None:
        self.settings = settings
        self.gateway = gateway
        self.waits = waits

    async def get(self, request: Request) -> Response:
        """``GET /outcomes/{source}/{event_id}``."""
        denied = self.denied(request.headers.get("authorization"))
        if denied is not None:
            return denied
        source: str = request.path_params["source"]
        event_id: str = request.path_params["event_id"]
        wait_s = preferred_wait_s(request.headers.get("prefer"))
        headers: dict[str, str] = {}
        try:
            if wait_s is None:
                told, accepted = await self.gateway.outcome_of(source, event_id)
            else:
                wait_s = min(wait_s, self.settings.outcome_wait_max_s)
                headers["preference-applied"] = f"wait={wait_s}"
                async with self.waits.waiting_for(source, event_id) as waiter:
                    # Subscribed first, then read: an outcome told in between is heard.
                    told, accepted = await self.gateway.outcome_of(source, event_id)
                    if told is None and accepted:
                        told = await waiter.outcome(wait_s)
        except BrokerUnavailable:
            return _error(503, "broker_unavailable", "Redis does not answer", {"retry-after": "5"})
        if told is not None:
            return Response(told, http_status_of(told), headers, media_type=_JSON)
        if accepted:
            return Response(pending_body(source, event_id), PENDING_STATUS, headers, _JSON)
        detail = f"no outcome and no accepted event {event_id!r} of source {source!r}"
        return _error(404, "unknown_event", detail)

    def denied(self, authorization: str | None) -> Response | None:
        """Why a request may not read outcomes (None: it may)."""
        token = self.settings.outcomes_token
        if token is None:
            detail = (
                "outcomes are closed: set KEYLANE_OUTCOMES_TOKEN to a secret and send it as "
                "'Authorization: Bearer <token>' (see ops/docs/outcomes.md)"
            )
            return _error(403, "outcomes_closed", detail)
        scheme, _, given = (authorization or "").partition(" ")
        expected = token.get_secret_value().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            bearer = {"www-authenticate": 'Bearer realm="keylane outcomes"'}
            return _error(401, "bad_token", "a valid bearer token is required", bearer)
        return None


def _error(status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> Response:
    return Response(_ENCODE({"error": code, "detail": detail}), status, headers, _JSON)

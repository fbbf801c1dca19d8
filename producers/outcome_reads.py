"""``GET /outcomes/{source}/{event_id}``: an event's told outcome, asked for later
(optionally waiting, ``Prefer: wait=N``), for whoever holds the outcomes token.

An outcome carries record data (the revision, the values an event wrote), so the route
is closed unless a token is configured: the global ``KEYLANE_OUTCOMES_TOKEN``, which reads
every source's outcomes, or a source's own (``outcomes_token_env`` in the sources file
names the environment variable holding it), which reads that source's only. Without
either for the source asked, it answers 403 and says how to open it; with one, a request
without a token that opens it gets 401. Tokens are compared in constant time, each one
given compared with every token that could open the source.

Answers: the told outcome with its status (200 applied, 409 refused, 422 dead-lettered;
``routing/contract/outcomes.py``); 202 ``{"status": "pending"}`` while the event is
accepted (its dedupe mark is there) but not decided; 404 when keylane knows nothing of it
(never accepted, or past its retention).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping

import msgspec
from pydantic import SecretStr
from starlette.requests import Request
from starlette.responses import Response

from ..routing.contract.errors import BrokerUnavailable, ConfigError
from ..routing.contract.outcomes import (
    PENDING_STATUS,
    http_status_of,
    pending_body,
    preferred_wait_s,
)
from ..routing.contract.settings import Settings
from ..routing.contract.sources import Sources
from .gateway import ReceiverGateway
from .outcome_waits import OutcomeWaits

log = logging.getLogger("keylane.receiver")

OUTCOME_ROUTE = "/outcomes/{source}/{event_id:path}"
_ENCODE = msgspec.json.Encoder().encode
_JSON = "application/json"


class OutcomeReads:
    """The outcomes route (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        gateway: ReceiverGateway,
        waits: OutcomeWaits,
        source_tokens: Mapping[str, SecretStr] | None = None,
        sources: Sources | None = None,
    ) -> None:
        self.settings = settings
        #: Whose retention (how long an id is remembered) the route looks within.
        self.sources = sources
        self.gateway = gateway
        self.waits = waits
        #: Each source's own outcomes token (:func:`source_tokens`).
        self.source_tokens = dict(source_tokens or {})

    async def get(self, request: Request) -> Response:
        """``GET /outcomes/{source}/{event_id}``."""
        source: str = request.path_params["source"]
        event_id: str = request.path_params["event_id"]
        denied = self.denied(request.headers.get("authorization"), source)
        if denied is not None:
            return denied
        wait_s = preferred_wait_s(request.headers.get("prefer"))
        headers: dict[str, str] = {}
        if wait_s is not None:
            wait_s = min(wait_s, self.settings.outcome_wait_max_s)
            headers["preference-applied"] = f"wait={wait_s}"
        try:
            retention_s = retention_of(self.sources, source, self.settings)
            told, accepted = await read_told(
                self.gateway, self.waits, source, event_id, wait_s, retention_s
            )
        except BrokerUnavailable:
            return _error(503, "broker_unavailable", "Redis does not answer", {"retry-after": "5"})
        if told is not None:
            return Response(told, http_status_of(told), headers, media_type=_JSON)
        if accepted:
            return Response(pending_body(source, event_id), PENDING_STATUS, headers, _JSON)
        detail = f"no outcome and no accepted event {event_id!r} of source {source!r}"
        return _error(404, "unknown_event", detail)

    async def retold(self, source: str, event_id: str, retention_s: int) -> bytes | None:
        """The outcome of a replay accepted longer ago than Redis keeps a told outcome,
        told anew by its lane from the journal (the accept queued it again): subscribed
        first, then read, so a tell that came first is read and a later one heard; None
        when none comes within ``KEYLANE_OUTCOME_REPLAY_WAIT_S``, or Redis stops answering
        meanwhile (answered as an undecided duplicate: the replay is queued)."""
        wait_s = self.settings.outcome_replay_wait_s
        try:
            told, _ = await read_told(
                self.gateway, self.waits, source, event_id, wait_s, retention_s
            )
        except BrokerUnavailable as exc:
            log.warning("a replay's outcome could not be read: %s", exc)
            return None
        return told

    def denied(self, authorization: str | None, source: str) -> Response | None:
        """Why a request may not read ``source``'s outcomes (None: it may)."""
        tokens = [self.settings.outcomes_token, self.source_tokens.get(source)]
        expected = [t.get_secret_value().encode() for t in tokens if t is not None]
        if not expected:
            detail = (
                "outcomes are closed: set KEYLANE_OUTCOMES_TOKEN (every source) or the "
                "source's outcomes_token_env (its own) to a secret and send it as "
                "'Authorization: Bearer <token>' (see ops/docs/outcomes.md)"
            )
            return _error(403, "outcomes_closed", detail)
        scheme, _, given = (authorization or "").partition(" ")
        offered = given.strip().encode()
        # Every token compared, whichever matches: the time taken says nothing of which.
        matched = [hmac.compare_digest(offered, token) for token in expected]
        if scheme.lower() != "bearer" or not any(matched):
            bearer = {"www-authenticate": 'Bearer realm="keylane outcomes"'}
            return _error(401, "bad_token", "a valid bearer token is required", bearer)
        return None


async def read_told(
    gateway: ReceiverGateway,
    waits: OutcomeWaits,
    source: str,
    event_id: str,
    wait_s: float | None,
    retention_s: int,
) -> tuple[bytes | None, bool]:
    """An event's told outcome (None: not decided, no longer kept, or not within
    ``wait_s``), and whether it was accepted (within ``retention_s``, its source's); with
    ``wait_s``, an accepted event's outcome is waited for (the route here, ``keylane
    outcome --wait``, a replay retold by its lane)."""
    retention_ms = retention_s * 1000
    if wait_s is None:
        return await gateway.outcome_of(source, event_id, retention_ms)
    async with waits.waiting_for(source, event_id) as waiter:
        # Subscribed first, then read: an outcome told in between is heard.
        told, accepted = await gateway.outcome_of(source, event_id, retention_ms)
        if told is None and accepted:
            told = await waiter.outcome(wait_s)
    return told, accepted


def retention_of(sources: Sources | None, name: str, settings: Settings) -> int:
    """How long source ``name``'s event ids are remembered, in seconds (the settings'
    retention for a source not configured)."""
    source = None if sources is None else sources.get(name)
    return settings.dedupe_retention_s if source is None else source.retention(settings)


def source_tokens(sources: Sources, environ: Mapping[str, str]) -> dict[str, SecretStr]:
    """Each source's own outcomes token, read from the variable its ``outcomes_token_env``
    names; :class:`ConfigError` names a variable that is unset or empty (never a value)."""
    tokens: dict[str, SecretStr] = {}
    for source in sources.all():
        name = source.outcomes_token_env
        if name is None:
            continue
        value = environ.get(name, "").strip()
        if not value:
            raise ConfigError(
                f"environment variable {name} is not set or empty (source {source.name}'s "
                "outcomes token, outcomes_token_env)"
            )
        tokens[source.name] = SecretStr(value)
    return tokens


def _error(status: int, code: str, detail: str, headers: dict[str, str] | None = None) -> Response:
    return Response(_ENCODE({"error": code, "detail": detail}), status, headers, _JSON)

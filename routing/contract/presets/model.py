"""What a sender preset says: how the provider signs, where its event id and type are,
how long it retries, what it sends in one delivery, how it checks an endpoint and what it
wants back. Pure data: the receiver's verifiers and handshakes read it
(``producers/signatures/``, ``producers/handshakes.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

DAY_S = 24 * 3600
HOUR_S = 3600

Algorithm: TypeAlias = Literal["sha1", "sha256", "sha512"]
Encoding: TypeAlias = Literal["hex", "base64"]

#: How a verifier checks a delivery: an HMAC laid out as a :class:`SignatureLayout`
#: (most providers), Twilio's signature of the URL and its parameters, a shared token or
#: HTTP Basic credentials, the organization id a Salesforce message carries, the
#: ``clientState`` of Microsoft Graph's notifications, or nothing.
Check: TypeAlias = Literal[
    "hmac", "standard_webhooks", "twilio", "token", "basic", "salesforce", "graph", "none"
]
#: A handshake the receiver answers itself, recording nothing (producers/handshakes.py).
Handshake: TypeAlias = Literal[
    "slack", "zoom", "meta", "mailchimp", "graph", "asana", "notion", "monday"
]
#: The body of a 2xx a sender expects instead of keylane's JSON (producers/answers.py).
Reply: TypeAlias = Literal["salesforce_ack", "twiml"]
#: How the secret becomes the HMAC key: its UTF-8 text, base64 or hex decoded, or a
#: Standard Webhooks ``whsec_<base64>`` secret.
KeyForm: TypeAlias = Literal["utf8", "base64", "hex", "whsec"]


@dataclass(frozen=True)
class SignatureLayout:
    """Where a sender puts its signature and what it signs.

    The header holds the signature (after ``prefix``), or several separated by
    ``several``; or, with ``pairs``, ``key=value`` entries separated by that character
    (``t=…,v1=…``: the timestamp under ``timestamp_key``, each digest under
    ``signature_key``). The signed payload is ``signed_payload`` with ``{body}`` (the bytes
    as they came), ``{timestamp}`` (as sent), ``{event_id}``, ``{method}`` and ``{url}``
    (the URL the sender called: ``KEYLANE_PUBLIC_URL``) filled in. ``digest = "hash"``
    hashes the secret followed by the payload instead of an HMAC (HubSpot's v1 and v2).
    """

    header: str
    algorithm: Algorithm = "sha256"
    encoding: Encoding = "hex"
    prefix: str = ""
    several: str | None = None
    pairs: str | None = None
    signature_key: str = "v1"
    timestamp_key: str = "t"
    timestamp_header: str | None = None
    #: How the timestamp is written: Unix seconds, Unix milliseconds, or an ISO 8601
    #: date and time with its zone (Zendesk's ``2021-07-25T10:00:00Z``).
    timestamp_unit: Literal["s", "ms", "iso"] = "s"
    signed_payload: str = "{body}"
    event_id_header: str | None = None
    key: KeyForm = "utf8"
    digest: Literal["hmac", "hash"] = "hmac"

    @property
    def signs_url(self) -> bool:
        """Whether the URL the sender called is part of what it signs."""
        return "{url}" in self.signed_payload

    @property
    def timed(self) -> bool:
        """Whether a signed timestamp comes with the signature (checked for tolerance)."""
        return self.timestamp_header is not None or (
            self.pairs is not None and "{timestamp}" in self.signed_payload
        )


@dataclass(frozen=True)
class Preset:
    """One provider: everything a ``verify = {scheme = "<name>"}`` source gets by default.

    ``event_id``, ``event_type`` and ``items`` are references as a sources file writes
    them (``body:…``, ``header:…``); ``retention_s`` is how long its ids are remembered:
    the provider's longest retry window, with margin; ``digest_excludes`` are the fields
    it changes between a delivery and its retry (HubSpot's ``attemptNumber``), left out
    of the digest that tells a retry from an id reused with another body.
    """

    name: str
    title: str
    check: Check
    event_id: str
    retention_s: int
    docs: str
    layout: SignatureLayout | None = None
    event_type: str | None = "body:type"
    items: str | None = None
    digest_excludes: tuple[str, ...] = ()
    json_fields: tuple[str, ...] = ()
    body: Literal["auto", "json", "form", "multipart", "xml"] = "auto"
    handshake: Handshake | None = None
    reply: Reply | None = None
    #: Options its ``verify`` table may set besides ``scheme`` and ``secrets_env``.
    options: frozenset[str] = frozenset()
    #: Whether it needs ``secrets_env`` (a check of a signature, token or credentials).
    needs_secrets: bool = True
    #: The default tolerance of a signed timestamp, seconds.
    tolerance_s: int = 300
    #: Where a ``token`` check finds the token the sender sends, by default
    #: (``header:<name>`` or ``query:<name>``; a source's ``verify.token`` overrides it).
    sent_in: str | None = None
    #: What a delivery without an event id gets (the source's ``missing_id``).
    missing_id: Literal["unique", "content-hash", "reject"] = "unique"

    @property
    def signs_url(self) -> bool:
        """Whether its check needs the URL the sender called (``KEYLANE_PUBLIC_URL``)."""
        return self.check == "twilio" or (self.layout is not None and self.layout.signs_url)

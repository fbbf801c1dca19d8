"""The HMAC verifier every layout-described sender goes through: a sources file's ``hmac``
scheme, and each preset that signs with an HMAC (:class:`SignatureLayout`: GitHub,
Shopify, Stripe, Paddle, Calendly, Slack, Zoom, Meta, Intercom, Typeform, HubSpot, Asana).

The signature header holds one digest (hex or base64, after an optional prefix such as
``sha256=``), several (``several``), or ``key=value`` pairs (``t=…,v1=…``: the timestamp
and each digest); the signed payload is a template over the body as it came, the
timestamp as it was sent, the event id, the method and the URL the sender called. A
timestamp is checked against the tolerance either way (past and future).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...routing.contract.errors import SignatureError
from ...routing.contract.presets import SignatureLayout
from ...routing.contract.signing import HmacConfig, compile_template, placeholders
from .signing_keys import SecretInput, SigningKeys, decode_signature, hmac_key
from .verifier import (
    NO_TARGET,
    Target,
    Verified,
    check_tolerance,
    lower_headers,
    malformed,
    no_match,
    parse_timestamp,
    require_header,
)


def layout_of(config: HmacConfig) -> SignatureLayout:
    """The signature layout a sources file's ``hmac`` table describes."""
    return SignatureLayout(
        header=config.header,
        algorithm=config.algorithm,
        encoding=config.encoding,
        prefix=config.prefix,
        timestamp_header=config.timestamp_header,
        signed_payload=config.signed_payload,
        event_id_header=config.event_id_header,
    )


def render(template: tuple[str, ...], values: Mapping[str, bytes]) -> bytes:
    """The signed payload: ``template``'s literals as UTF-8, its placeholders from ``values``."""
    pieces = [
        values[part] if position % 2 else part.encode() for position, part in enumerate(template)
    ]
    return b"".join(pieces)


class HmacVerifier:
    """Verifies a signature laid out as a :class:`SignatureLayout` says."""

    name: str

    def __init__(
        self,
        name: str,
        secrets: Sequence[SecretInput],
        layout: SignatureLayout,
        tolerance_s: int = 300,
    ) -> None:
        self.name = name
        self.layout = layout
        self.tolerance_s = tolerance_s
        self._template = compile_template(layout.signed_payload)
        self._keys = SigningKeys(
            name, (hmac_key(s, layout.key, name, n) for n, s in enumerate(secrets, 1))
        )

    def __repr__(self) -> str:
        return (
            f"HmacVerifier(name={self.name!r}, keys={len(self._keys)}, layout={self.layout!r}, "
            f"tolerance_s={self.tolerance_s})"
        )

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float, target: Target = NO_TARGET
    ) -> Verified:
        """What a delivery signed with a held secret vouches for; ``SignatureError`` if not."""
        lowered = lower_headers(headers)
        raw_timestamp, signatures = self._read(lowered)
        if raw_timestamp is not None:
            header = self.layout.timestamp_header or self.layout.header
            at = parse_timestamp(raw_timestamp, header, self.layout.timestamp_unit)
            check_tolerance(at, now, self.tolerance_s)
        event_id = self._event_id(lowered)
        values = {"body": body}
        if raw_timestamp is not None:
            # Signed as sent: the sender formatted it, so its exact text is what it signed.
            values["timestamp"] = raw_timestamp.encode()
        if event_id is not None:
            values["event_id"] = event_id.encode()
        if self.layout.signs_url:
            if not target.url:
                raise SignatureError(f"{self.name} signs the URL it called: none is configured")
            values["url"] = target.url.encode()
        values["method"] = target.method.encode()
        message = render(self._template, values)
        if not self._keys.match(message, signatures, self.layout.algorithm, self.layout.digest):
            raise no_match()
        timestamp = None if raw_timestamp is None else float(at)
        return Verified(scheme=self.name, event_id=event_id, timestamp=timestamp)

    def _read(self, headers: Mapping[str, str]) -> tuple[str | None, list[bytes]]:
        """The timestamp as sent (None when the layout has none) and the decodable digests."""
        layout = self.layout
        value = require_header(headers, layout.header)
        if layout.pairs is not None:
            return self._pairs(value)
        texts = value.split(layout.several) if layout.several else [value]
        digests = [self._digest(text.strip()) for text in texts if text.strip()]
        signatures = [digest for digest in digests if digest is not None]
        if not signatures:
            if not value.startswith(layout.prefix):
                raise malformed(layout.header, f"expected the prefix {layout.prefix!r}")
            raise malformed(layout.header, f"signature is not {layout.encoding}")
        timestamp = None
        if layout.timestamp_header is not None:
            timestamp = require_header(headers, layout.timestamp_header)
        return timestamp, signatures

    def _pairs(self, value: str) -> tuple[str | None, list[bytes]]:
        layout = self.layout
        fields = [item.strip().partition("=") for item in value.split(layout.pairs)]
        stamps = [raw.strip() for key, _, raw in fields if key == layout.timestamp_key]
        if not stamps and "timestamp" in placeholders(self._template):
            raise malformed(layout.header, f"no {layout.timestamp_key}= timestamp")
        digests = [
            self._digest(raw.strip()) for key, _, raw in fields if key == layout.signature_key
        ]
        signatures = [digest for digest in digests if digest is not None]
        if not signatures:
            raise malformed(layout.header, f"no {layout.signature_key} signature")
        # The first timestamp wins, as in the providers' own parsers.
        return (stamps[0] if stamps else None), signatures

    def _digest(self, text: str) -> bytes | None:
        if not text.startswith(self.layout.prefix):
            return None
        return decode_signature(text[len(self.layout.prefix) :], self.layout.encoding)

    def _event_id(self, headers: Mapping[str, str]) -> str | None:
        header = self.layout.event_id_header
        if header is None:
            return None
        if "event_id" in placeholders(self._template):
            return require_header(headers, header)
        # Unsigned, so only a hint for dedupe: absent is not an error.
        return headers.get(header, "").strip() or None

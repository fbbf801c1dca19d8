"""Stripe: ``Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>…][,v0=<hex>]``.

Each ``v1`` is the hex HMAC-SHA256 of ``f"{t}.{body}"``. The key is the endpoint secret
exactly as written, ``whsec_`` prefix included, as UTF-8 bytes — unlike Standard
Webhooks, whose ``whsec_`` secrets are base64 (stripe 16.1,
``stripe/_webhook.py: WebhookSignature._compute_signature``). While an endpoint secret is
being rolled Stripe sends one ``v1`` per live secret; ``v0`` is a test-mode scheme and is
ignored. The event id is in the body (``id``), not in a header.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .signing_keys import SecretInput, SigningKeys, decode_signature, utf8_key
from .verifier import (
    Verified,
    check_tolerance,
    lower_headers,
    malformed,
    no_match,
    parse_timestamp,
    require_header,
)

HEADER = "stripe-signature"
DEFAULT_TOLERANCE_S = 300


class StripeVerifier:
    """Verifies Stripe's ``Stripe-Signature`` header."""

    name: str

    def __init__(
        self, secrets: Sequence[SecretInput], tolerance_s: int = DEFAULT_TOLERANCE_S
    ) -> None:
        self.name = "stripe"
        self.tolerance_s = tolerance_s
        self._keys = SigningKeys(self.name, (utf8_key(s) for s in secrets))

    def __repr__(self) -> str:
        return f"StripeVerifier(keys={len(self._keys)}, tolerance_s={self.tolerance_s})"

    def verify(self, headers: Mapping[str, str], body: bytes, now: float) -> Verified:
        """The signed timestamp of a delivery Stripe signed; ``SignatureError`` if not."""
        timestamp, signatures = parse_header(require_header(lower_headers(headers), HEADER))
        # Stripe's own library only refuses old timestamps; a future one is refused here
        # too, so a signature cannot be minted to outlive the tolerance.
        check_tolerance(timestamp, now, self.tolerance_s)
        # Stripe signs the timestamp as it formats the parsed integer ("%d"), which for
        # the digits-only values accepted here is the value with leading zeros dropped.
        if not self._keys.match(f"{timestamp}.".encode() + body, signatures, "sha256"):
            raise no_match()
        return Verified(scheme=self.name, event_id=None, timestamp=float(timestamp))


def parse_header(value: str) -> tuple[int, list[bytes]]:
    """The timestamp and the decodable ``v1`` digests of a ``Stripe-Signature`` value."""
    fields = [item.strip().partition("=") for item in value.split(",")]
    stamps = [raw for key, _, raw in fields if key == "t"]
    if not stamps:
        raise malformed(HEADER, "no t= timestamp")
    # The first t= wins, as in Stripe's own parser.
    timestamp = parse_timestamp(stamps[0].strip(), HEADER)
    digests = [decode_signature(raw.strip(), "hex") for key, _, raw in fields if key == "v1"]
    signatures = [digest for digest in digests if digest is not None]
    if not signatures:
        raise malformed(HEADER, "no v1 signature")
    return timestamp, signatures

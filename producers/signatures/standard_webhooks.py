"""Standard Webhooks (Svix and others): headers webhook-id, webhook-timestamp, webhook-signature
(or, as Svix sends them, svix-id, svix-timestamp, svix-signature: the ``svix`` package's
verifier takes either family, and so does this one).

``webhook-signature`` is a space-separated list of ``<version>,<signature>``; each ``v1``
is the base64 HMAC-SHA256 of ``f"{id}.{timestamp}.{body}"``. Several appear while the
sender rotates its secret; other versions (``v1a`` is Ed25519) are skipped.

Secrets follow the ``standardwebhooks`` package (1.1, ``webhooks.Webhook.__init__``)
exactly: text has its ``whsec_`` prefix removed and is base64-decoded leniently
(padding added, characters outside the alphabet dropped), while bytes are the raw key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADER = "webhook-signature"
#: Svix's own names for the same three headers.
SVIX_HEADERS = {
    ID_HEADER: "svix-id",
    TIMESTAMP_HEADER: "svix-timestamp",
    SIGNATURE_HEADER: "svix-signature",
}
DEFAULT_TOLERANCE_S = 300


class StandardWebhooksVerifier:
    """Verifies the Standard Webhooks headers."""

    name: str

    def __init__(
        self, secrets: Sequence[SecretInput], tolerance_s: int = DEFAULT_TOLERANCE_S
    ) -> None:
        self.name = "standard_webhooks"
        self.tolerance_s = tolerance_s
        keys = (hmac_key(s, "whsec", self.name, n) for n, s in enumerate(secrets, 1))
        self._keys = SigningKeys(self.name, keys)

    def __repr__(self) -> str:
        return f"StandardWebhooksVerifier(keys={len(self._keys)}, tolerance_s={self.tolerance_s})"

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float, target: Target = NO_TARGET
    ) -> Verified:
        """The message id and timestamp of a signed delivery; ``SignatureError`` if not."""
        lowered = lower_headers(headers)
        if ID_HEADER not in lowered and SVIX_HEADERS[ID_HEADER] in lowered:
            lowered = {name: lowered.get(svix, "") for name, svix in SVIX_HEADERS.items()}
        msg_id = require_header(lowered, ID_HEADER)
        timestamp = parse_timestamp(require_header(lowered, TIMESTAMP_HEADER), TIMESTAMP_HEADER)
        signatures = parse_signatures(require_header(lowered, SIGNATURE_HEADER))
        check_tolerance(timestamp, now, self.tolerance_s)
        # The package signs floor(float(header)), i.e. the integer without leading zeros.
        signed = f"{msg_id}.{timestamp}.".encode() + body
        if not self._keys.match(signed, signatures, "sha256"):
            raise no_match()
        return Verified(scheme=self.name, event_id=msg_id, timestamp=float(timestamp))


def parse_signatures(value: str) -> list[bytes]:
    """The decodable ``v1`` digests of a ``webhook-signature`` value."""
    digests = []
    for entry in value.split():
        version, _, signature = entry.partition(",")
        if version == "v1":
            digests.append(decode_signature(signature, "base64"))
    signatures = [digest for digest in digests if digest is not None]
    if not signatures:
        raise malformed(SIGNATURE_HEADER, "no v1 signature")
    return signatures

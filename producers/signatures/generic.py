"""A configurable HMAC scheme, for senders that sign their own way.

The signature header holds one digest (hex or base64, after an optional prefix such as
``sha256=``) of a signed payload built from a template: ``{body}`` alone by default, or
e.g. ``{timestamp}.{body}`` with the timestamp read from its own header and checked
against a tolerance. GitHub and Shopify are fixed instances of this scheme.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...routing.contract.signing import (
    Algorithm,
    Encoding,
    HmacConfig,
    check_signed_payload,
    compile_template,
    placeholders,
)
from .signing_keys import (
    SecretInput,
    SigningKeys,
    decode_signature,
    utf8_key,
)
from .verifier import (
    Verified,
    check_tolerance,
    lower_headers,
    malformed,
    no_match,
    parse_timestamp,
    require_header,
)


@dataclass(frozen=True)
class HmacSpec:
    """Where a sender puts its HMAC signature and what it signs."""

    header: str
    algorithm: Algorithm = "sha256"
    encoding: Encoding = "hex"
    prefix: str = ""
    timestamp_header: str | None = None
    signed_payload: str = "{body}"
    tolerance_s: int = 300
    event_id_header: str | None = None

    def __post_init__(self) -> None:
        check_signed_payload(self.signed_payload, self.timestamp_header, self.event_id_header)

    @classmethod
    def of(cls, config: HmacConfig) -> HmacSpec:
        """The signature layout a sources file's ``hmac`` table describes."""
        return cls(
            header=config.header,
            algorithm=config.algorithm,
            encoding=config.encoding,
            prefix=config.prefix,
            timestamp_header=config.timestamp_header,
            signed_payload=config.signed_payload,
            tolerance_s=config.tolerance_s,
            event_id_header=config.event_id_header,
        )


def render(template: tuple[str, ...], values: Mapping[str, bytes]) -> bytes:
    """The signed payload: ``template``'s literals as UTF-8, its placeholders from ``values``."""
    pieces = [
        values[part] if position % 2 else part.encode() for position, part in enumerate(template)
    ]
    return b"".join(pieces)


class HmacVerifier:
    """Verifies an HMAC signature laid out as an :class:`HmacSpec` says."""

    name: str

    def __init__(self, name: str, secrets: Sequence[SecretInput], spec: HmacSpec) -> None:
        self.name = name
        self.spec = spec
        self._template = compile_template(spec.signed_payload)
        self._keys = SigningKeys(name, (utf8_key(s) for s in secrets))

    def __repr__(self) -> str:
        return f"HmacVerifier(name={self.name!r}, keys={len(self._keys)}, spec={self.spec!r})"

    def verify(self, headers: Mapping[str, str], body: bytes, now: float) -> Verified:
        """What a delivery signed with a held secret vouches for; ``SignatureError`` if not."""
        lowered = lower_headers(headers)
        signatures = [self._signature(lowered)]
        raw_timestamp = self._timestamp(lowered, now)
        event_id = self._event_id(lowered)
        values = {"body": body}
        if raw_timestamp is not None:
            # Signed as sent: the sender formatted it, so its exact text is what it signed.
            values["timestamp"] = raw_timestamp.encode()
        if event_id is not None:
            values["event_id"] = event_id.encode()
        if not self._keys.match(render(self._template, values), signatures, self.spec.algorithm):
            raise no_match()
        timestamp = None if raw_timestamp is None else float(raw_timestamp)
        return Verified(scheme=self.name, event_id=event_id, timestamp=timestamp)

    def _signature(self, headers: Mapping[str, str]) -> bytes:
        header = self.spec.header.lower()
        value = require_header(headers, header)
        if not value.startswith(self.spec.prefix):
            raise malformed(header, f"expected the prefix {self.spec.prefix!r}")
        digest = decode_signature(value[len(self.spec.prefix) :], self.spec.encoding)
        if digest is None:
            raise malformed(header, f"signature is not {self.spec.encoding}")
        return digest

    def _timestamp(self, headers: Mapping[str, str], now: float) -> str | None:
        if self.spec.timestamp_header is None:
            return None
        header = self.spec.timestamp_header.lower()
        raw = require_header(headers, header)
        check_tolerance(parse_timestamp(raw, header), now, self.spec.tolerance_s)
        return raw

    def _event_id(self, headers: Mapping[str, str]) -> str | None:
        if self.spec.event_id_header is None:
            return None
        header = self.spec.event_id_header.lower()
        if "event_id" in placeholders(self._template):
            return require_header(headers, header)
        # Unsigned, so only a hint for dedupe: absent is not an error.
        return headers.get(header, "").strip() or None

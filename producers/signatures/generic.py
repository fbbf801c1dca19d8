"""A configurable HMAC scheme, for senders that sign their own way.

The signature header holds one digest (hex or base64, after an optional prefix such as
``sha256=``) of a signed payload built from a template: ``{body}`` alone by default, or
e.g. ``{timestamp}.{body}`` with the timestamp read from its own header and checked
against a tolerance. GitHub and Shopify are fixed instances of this scheme.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from producers.signatures.base import (
    Verified,
    check_tolerance,
    lower_headers,
    malformed,
    no_match,
    parse_timestamp,
    require_header,
)
from producers.signatures.keys import (
    Algorithm,
    Encoding,
    SecretInput,
    SigningKeys,
    decode_signature,
    utf8_key,
)

PLACEHOLDERS = ("body", "timestamp", "event_id")
_PLACEHOLDER = re.compile(r"\{(body|timestamp|event_id)\}")


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
        names = placeholders(compile_template(self.signed_payload))
        if ("timestamp" in names) != (self.timestamp_header is not None):
            # A timestamp header that is not signed protects against nothing, and a
            # signed timestamp must come from somewhere.
            raise ValueError(
                "signed_payload uses {timestamp} if and only if timestamp_header is set"
            )
        if "event_id" in names and self.event_id_header is None:
            raise ValueError("signed_payload uses {event_id} but event_id_header is not set")


def compile_template(text: str) -> tuple[str, ...]:
    """``text`` split into literal parts and placeholder names (at odd positions).

    Raises ``ValueError`` unless ``{body}`` appears exactly once and every other brace
    belongs to a known placeholder.
    """
    parts = tuple(_PLACEHOLDER.split(text))
    literals, names = parts[0::2], parts[1::2]
    if names.count("body") != 1:
        raise ValueError("signed_payload must contain {body} exactly once")
    if any("{" in literal or "}" in literal for literal in literals):
        raise ValueError(f"signed_payload may only use the placeholders {PLACEHOLDERS}")
    return parts


def placeholders(template: tuple[str, ...]) -> tuple[str, ...]:
    """The placeholder names a compiled ``template`` uses (not its literal text)."""
    return template[1::2]


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

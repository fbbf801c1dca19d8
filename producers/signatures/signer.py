"""Signing a delivery as a source's sender signs it, for ``keylane send``: the other half
of each verifier, built from the same definitions (a preset's :class:`SignatureLayout`,
the signed payload's template and :func:`render`, the key a secret stands for, Standard
Webhooks' and Twilio's signed text), so that what is signed here and what the receiver
verifies cannot drift apart (``tests/test_send_signing.py`` verifies every preset's).

A check with nothing to sign (``none``; Salesforce's organization id and Graph's
``clientState``, which are in the body the sender writes) adds nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import parse_qsl, urlencode

from ...routing.contract.errors import ConfigError
from ...routing.contract.presets import PRESETS, SignatureLayout
from ...routing.contract.signing import (
    HmacConfig,
    NoneConfig,
    PresetConfig,
    VerifyConfig,
    compile_template,
    placeholders,
    standard_webhooks_signature,
)
from .generic import layout_of, render
from .signing_keys import SecretInput, hmac_key, utf8_key
from .standard_webhooks import ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER
from .twilio import BODY_SHA256, signed_params
from .twilio import HEADER as TWILIO_HEADER
from .verifier import lower_headers


@dataclass(frozen=True)
class Outgoing:
    """A delivery about to be sent: its body, headers so far (the event id's among them,
    where the scheme carries it in one), its query string, and the URL the receiver will
    take it to have called without that query (``""``: none is configured)."""

    body: bytes
    headers: Mapping[str, str]
    query: str = ""
    called: str = ""


@dataclass(frozen=True)
class Signature:
    """What signing adds: headers, and the query string to send instead (a token sent in
    the URL, Twilio's ``bodySHA256``)."""

    headers: dict[str, str]
    query: str


def sign(config: VerifyConfig, secret: SecretInput | None, out: Outgoing, now: float) -> Signature:
    """``out`` signed as ``config``'s sender signs it with ``secret`` (None for a check
    without one); ``ConfigError`` when it cannot be (no secret for a scheme that needs
    one, no public URL for one that signs the URL)."""
    if isinstance(config, NoneConfig):
        return Signature({}, out.query)
    if isinstance(config, HmacConfig):
        return _hmac(config.scheme, layout_of(config), _need(config.scheme, secret), out, now)
    preset = PRESETS[config.scheme]
    if preset.check == "hmac":
        assert preset.layout is not None
        return _hmac(config.scheme, preset.layout, _need(config.scheme, secret), out, now)
    if preset.check == "standard_webhooks":
        return _standard_webhooks(_need(config.scheme, secret), out, now)
    if preset.check == "twilio":
        return _twilio(_need(config.scheme, secret), out)
    if preset.check == "token":
        return _token(config, _need(config.scheme, secret), out)
    if preset.check == "basic":
        credentials = base64.b64encode(utf8_key(_need(config.scheme, secret))).decode()
        return Signature({"Authorization": f"Basic {credentials}"}, out.query)
    return Signature({}, out.query)  # salesforce, graph: the proof is in the body


def _need(scheme: str, secret: SecretInput | None) -> SecretInput:
    if secret is None:
        raise ConfigError(f"the {scheme} scheme signs with a secret: none is set")
    return secret


def _url(out: Outgoing, query: str, scheme: str) -> str:
    if not out.called:
        raise ConfigError(
            f"{scheme} signs the URL it calls: set KEYLANE_PUBLIC_URL (or the source's "
            "public_url) as the receiver has it"
        )
    return f"{out.called}?{query}" if query else out.called


def _timestamp(layout: SignatureLayout, now: float) -> str:
    if layout.timestamp_unit == "ms":
        return str(int(now * 1000))
    if layout.timestamp_unit == "iso":
        return datetime.fromtimestamp(int(now), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(int(now))


def _hmac(
    scheme: str, layout: SignatureLayout, secret: SecretInput, out: Outgoing, now: float
) -> Signature:
    template = compile_template(layout.signed_payload)
    names = placeholders(template)
    stamp = _timestamp(layout, now)
    values = {"body": out.body, "timestamp": stamp.encode(), "method": b"POST"}
    headers: dict[str, str] = {}
    if "event_id" in names:
        assert layout.event_id_header is not None
        event_id = lower_headers(out.headers).get(layout.event_id_header)
        if event_id is None:
            raise ConfigError(f"{scheme} signs its event id: send one (--event-id)")
        values["event_id"] = event_id.encode()
    if "url" in names:
        values["url"] = _url(out, out.query, scheme).encode()
    message = render(template, values)
    key = hmac_key(secret, layout.key, scheme, 1)
    if layout.digest == "hash":
        digest = hashlib.new(layout.algorithm, key + message).digest()
    else:
        digest = hmac.new(key, message, layout.algorithm).digest()
    text = layout.prefix + (
        digest.hex() if layout.encoding == "hex" else base64.b64encode(digest).decode()
    )
    if layout.pairs is not None:
        signed = [f"{layout.signature_key}={text}"]
        if "timestamp" in names:
            signed.insert(0, f"{layout.timestamp_key}={stamp}")
        text = layout.pairs.join(signed)
    headers[layout.header] = text
    if layout.timestamp_header is not None:
        headers[layout.timestamp_header] = stamp
    return Signature(headers, out.query)


def _standard_webhooks(secret: SecretInput, out: Outgoing, now: float) -> Signature:
    msg_id = lower_headers(out.headers).get(ID_HEADER)
    if msg_id is None:
        raise ConfigError(f"standard_webhooks signs its {ID_HEADER}: send one (--event-id)")
    key = hmac_key(secret, "whsec", "standard_webhooks", 1)
    at = int(now)
    signature = standard_webhooks_signature(key, msg_id, at, out.body)
    return Signature({TIMESTAMP_HEADER: str(at), SIGNATURE_HEADER: signature}, out.query)


def _twilio(secret: SecretInput, out: Outgoing) -> Signature:
    content_type = lower_headers(out.headers).get("content-type", "")
    params = signed_params(out.body, content_type)
    query = out.query
    if not content_type.lower().startswith("application/x-www-form-urlencoded"):
        # A body that is not a form is signed through its SHA-256 in the URL.
        digest = hashlib.sha256(out.body).hexdigest()
        query = _with_param(query, BODY_SHA256, digest)
    message = _url(out, query, "twilio").encode() + params
    signature = base64.b64encode(hmac.new(utf8_key(secret), message, "sha1").digest()).decode()
    return Signature({TWILIO_HEADER: signature}, query)


def _token(config: PresetConfig, secret: SecretInput, out: Outgoing) -> Signature:
    kind, _, where = config.token_at.partition(":")
    token = utf8_key(secret).decode()
    if kind == "query":
        return Signature({}, _with_param(out.query, where, token))
    if where.lower() == "authorization":
        token = f"Bearer {token}"
    return Signature({where: token}, out.query)


def _with_param(query: str, name: str, value: str) -> str:
    pairs = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != name]
    return urlencode([*pairs, (name, value)])

"""From a source's signature configuration to its verifier."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import assert_never

from ...routing.contract.errors import ConfigError, SignatureError
from ...routing.contract.presets import PRESETS, SignatureLayout
from ...routing.contract.signing import (
    HmacConfig,
    NoneConfig,
    PresetConfig,
    VerifyConfig,
    load_secrets,
)
from ...routing.contract.sources import Sources
from .credentials import BasicVerifier, TokenVerifier
from .generic import HmacVerifier, layout_of
from .in_body import GraphVerifier, SalesforceVerifier
from .signing_keys import SecretInput
from .standard_webhooks import StandardWebhooksVerifier
from .twilio import TwilioVerifier
from .unsigned import UnsignedVerifier
from .verifier import NO_TARGET, Target, Verified, Verifier


def build_verifier(config: VerifyConfig, secrets: Sequence[SecretInput]) -> Verifier:
    """The verifier ``config`` describes, holding ``secrets`` (any of which may sign).

    Raises ``ConfigError`` if a signed scheme gets no secret, a secret is empty or cannot
    be decoded, or the ``none`` scheme is given secrets.
    """
    if isinstance(config, NoneConfig):
        if secrets:
            raise ConfigError("the none signature scheme takes no secrets")
        return UnsignedVerifier()
    if isinstance(config, HmacConfig):
        return HmacVerifier("hmac", secrets, layout_of(config), config.tolerance_s)
    if isinstance(config, PresetConfig):
        return _preset_verifier(config, secrets)
    assert_never(config)


def _preset_verifier(config: PresetConfig, secrets: Sequence[SecretInput]) -> Verifier:
    preset = PRESETS[config.scheme]
    check = preset.check
    if check == "hmac":
        assert preset.layout is not None
        if not secrets and not preset.needs_secrets:
            return KeptSecretVerifier(config.scheme, preset.layout, config.tolerance)
        return HmacVerifier(config.scheme, secrets, preset.layout, config.tolerance)
    if check == "standard_webhooks":
        return StandardWebhooksVerifier(secrets, config.tolerance)
    if check == "twilio":
        return TwilioVerifier(secrets)
    if check == "token":
        return TokenVerifier(config.scheme, secrets, config.token_at)
    if check == "basic":
        return BasicVerifier(config.scheme, secrets)
    if check == "salesforce":
        return SalesforceVerifier(config.organization_id)
    if check == "graph":
        return GraphVerifier(secrets)
    if check == "none":
        return UnsignedVerifier()
    assert_never(check)


class KeptSecretVerifier:
    """A sender that hands its secret over in a handshake (Asana's ``X-Hook-Secret``):
    nothing verifies until the secret kept from it is held (:meth:`hold`)."""

    name: str

    def __init__(self, name: str, layout: SignatureLayout, tolerance_s: int) -> None:
        self.name = name
        self.layout = layout
        self.tolerance_s = tolerance_s
        self.held: HmacVerifier | None = None
        self._held_sha256 = b""  # of the secret held, to tell a new one without keeping it

    def __repr__(self) -> str:
        return f"KeptSecretVerifier(name={self.name!r}, held={self.held is not None})"

    def hold(self, secret: str | None) -> None:
        """Verify with ``secret`` from now on (None: with nothing, it was forgotten)."""
        digest = b"" if secret is None else hashlib.sha256(secret.encode()).digest()
        if digest == self._held_sha256:
            return
        self._held_sha256 = digest
        self.held = None
        if secret is not None:
            self.held = HmacVerifier(self.name, [secret], self.layout, self.tolerance_s)

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float, target: Target = NO_TARGET
    ) -> Verified:
        """As the held secret's verifier; ``SignatureError`` while none is held."""
        if self.held is None:
            raise SignatureError(f"no {self.name} secret is kept yet (its handshake comes first)")
        return self.held.verify(headers, body, now, target)


def verifiers_of(sources: Sources, environ: Mapping[str, str]) -> dict[str, Verifier]:
    """Each source's verifier, with secrets read from ``environ`` (at start-up: a missing
    secret is a ConfigError naming the variable, never its value)."""
    return {s.name: verifier_from_environ(s.verify, environ) for s in sources.all()}


def verifier_from_environ(config: VerifyConfig, environ: Mapping[str, str]) -> Verifier:
    """The verifier ``config`` describes, with its secrets read from ``environ``."""
    return build_verifier(config, load_secrets(config, environ))

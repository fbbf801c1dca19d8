"""How a source's signature scheme is written in a sources file, and where its secrets live.

A source's ``verify`` table names the scheme and its options, and names environment
variables for the secrets, never the secrets themselves::

    verify = {scheme = "stripe", secrets_env = ["STRIPE_WHSEC", "STRIPE_WHSEC_OLD"]}
    verify = {scheme = "standard_webhooks", secrets_env = ["SVIX_SECRET"], tolerance_s = 300}
    verify = {scheme = "github", secrets_env = ["GITHUB_WEBHOOK_SECRET"]}
    verify = {scheme = "shopify", secrets_env = ["SHOPIFY_CLIENT_SECRET"]}
    verify = {scheme = "hmac", secrets_env = ["FORMS_SECRET"], header = "X-Signature",
              algorithm = "sha256", encoding = "hex", prefix = "sha256=",
              timestamp_header = "X-Timestamp", signed_payload = "{timestamp}.{body}",
              event_id_header = "X-Event-Id"}
    verify = {scheme = "none"}

Listing several variables is how a secret is rotated: a delivery verifies if any matches.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Mapping
from typing import Annotated, Literal, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    field_validator,
    model_validator,
)

from .errors import ConfigError
from .names import ENV_NAME, HEADER_NAME

Algorithm: TypeAlias = Literal["sha1", "sha256", "sha512"]
Encoding: TypeAlias = Literal["hex", "base64"]

PLACEHOLDERS = ("body", "timestamp", "event_id")
_PLACEHOLDER = re.compile(r"\{(body|timestamp|event_id)\}")
# RFC 9110 token characters: what a header name may be made of.

# An hour at most: a wider window lets a captured delivery be replayed for longer and
# hides clock trouble; providers re-sign every retry with a fresh timestamp anyway.
Tolerance = Annotated[int, Field(ge=1, le=3600)]


class NoneConfig(BaseModel):
    """Deliveries are not signed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scheme: Literal["none"] = "none"


class SignedConfig(BaseModel):
    """What every signed scheme has: the environment variables holding its secrets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    secrets_env: tuple[str, ...] = Field(min_length=1)

    @field_validator("secrets_env", mode="before")
    @classmethod
    def _one_name_is_a_list(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("secrets_env")
    @classmethod
    def _check_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"not an environment variable name: {name!r}")
        return names


class StandardWebhooksConfig(SignedConfig):
    """Standard Webhooks / Svix: secrets are ``whsec_<base64>``."""

    scheme: Literal["standard_webhooks"] = "standard_webhooks"
    tolerance_s: Tolerance = 300


class StripeConfig(SignedConfig):
    """Stripe: secrets are the endpoint's ``whsec_…`` signing secrets."""

    scheme: Literal["stripe"] = "stripe"
    tolerance_s: Tolerance = 300


class GithubConfig(SignedConfig):
    """GitHub: secrets are the webhook's secret."""

    scheme: Literal["github"] = "github"


class ShopifyConfig(SignedConfig):
    """Shopify: secrets are the app's client secret."""

    scheme: Literal["shopify"] = "shopify"


class HmacConfig(SignedConfig):
    """Any other sender's HMAC signature (verified by the receiver's generic HMAC scheme)."""

    scheme: Literal["hmac"] = "hmac"
    header: str
    algorithm: Algorithm = "sha256"
    encoding: Encoding = "hex"
    prefix: str = ""
    timestamp_header: str | None = None
    signed_payload: str = "{body}"
    tolerance_s: Tolerance = 300
    event_id_header: str | None = None

    @field_validator("header", "timestamp_header", "event_id_header")
    @classmethod
    def _check_header(cls, name: str | None) -> str | None:
        if name is not None and not HEADER_NAME.fullmatch(name):
            raise ValueError(f"not a header name: {name!r}")
        return None if name is None else name.lower()

    @model_validator(mode="after")
    def _check_payload(self) -> HmacConfig:
        check_signed_payload(self.signed_payload, self.timestamp_header, self.event_id_header)
        return self


VerifyConfig: TypeAlias = Annotated[
    NoneConfig | StandardWebhooksConfig | StripeConfig | GithubConfig | ShopifyConfig | HmacConfig,
    Field(discriminator="scheme"),
]
_VERIFY_CONFIG: TypeAdapter[VerifyConfig] = TypeAdapter(VerifyConfig)


def parse_verify_config(data: object) -> VerifyConfig:
    """The configuration in ``data`` (a sources file's ``verify`` table); raises ValidationError."""
    return _VERIFY_CONFIG.validate_python(data)


def load_secrets(config: VerifyConfig, environ: Mapping[str, str]) -> list[SecretStr]:
    """The secrets ``config`` names, read from ``environ`` in the order listed.

    Raises ``ConfigError`` naming the first variable that is unset or unusable; the
    message never carries a secret's value.
    """
    if isinstance(config, NoneConfig):
        return []
    return [_read_secret(name, config.scheme, environ) for name in config.secrets_env]


def _read_secret(name: str, scheme: str, environ: Mapping[str, str]) -> SecretStr:
    value = environ.get(name)
    if value is None:
        raise ConfigError(f"environment variable {name} is not set (a {scheme} signing secret)")
    if not value.strip():
        raise ConfigError(f"environment variable {name} is empty (a {scheme} signing secret)")
    if value != value.strip():
        # Almost always a pasted newline; it would change every HMAC and surface only
        # later as "no signature matched" on every delivery.
        raise ConfigError(
            f"environment variable {name} has leading or trailing whitespace "
            f"(a {scheme} signing secret)"
        )
    return SecretStr(value)


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


def check_signed_payload(
    signed_payload: str, timestamp_header: str | None, event_id_header: str | None
) -> None:
    """Raise ``ValueError`` unless the template and the headers it reads fit together."""
    names = placeholders(compile_template(signed_payload))
    if ("timestamp" in names) != (timestamp_header is not None):
        # A timestamp header that is not signed protects against nothing, and a
        # signed timestamp must come from somewhere.
        raise ValueError("signed_payload uses {timestamp} if and only if timestamp_header is set")
    if "event_id" in names and event_id_header is None:
        raise ValueError("signed_payload uses {event_id} but event_id_header is not set")


WHSEC_PREFIX = "whsec_"


def whsec_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks ``whsec_<base64>`` secret, derived as the
    ``standardwebhooks`` package does (prefix dropped, base64 decoded leniently);
    ``ValueError`` when it is not base64."""
    return base64.b64decode(secret.removeprefix(WHSEC_PREFIX) + "==")


def standard_webhooks_signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value (``v1,<base64 HMAC-SHA256>``) of a message."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()

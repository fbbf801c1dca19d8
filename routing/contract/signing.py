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

Any other scheme names a sender preset (:mod:`.presets`: ``twilio``, ``slack``,
``hubspot``, ``salesforce``, ``token``, ``basic``, ...), whose table takes the options the
preset lists::

    verify = {scheme = "twilio", secrets_env = ["TWILIO_AUTH_TOKEN"]}
    verify = {scheme = "token", secrets_env = ["FORMS_TOKEN"], token = "query:key"}
    verify = {scheme = "salesforce", organization_id = ["00D5e000000KQ2eEAG"]}
    verify = {scheme = "meta", secrets_env = ["META_APP_SECRET"],
              verify_token_env = "META_VERIFY_TOKEN"}

Listing several variables is how a secret is rotated: a delivery verifies if any matches.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    TypeAdapter,
    field_validator,
    model_validator,
)

from .errors import ConfigError
from .mapping import check_reference
from .names import HEADER_NAME, check_env_name
from .presets import PRESETS, Algorithm, Encoding

PLACEHOLDERS = ("body", "timestamp", "event_id", "method", "url")
_PLACEHOLDER = re.compile(r"\{(body|timestamp|event_id|method|url)\}")
# RFC 9110 token characters: what a header name may be made of.

# An hour at most: a wider window lets a captured delivery be replayed for longer and
# hides clock trouble; providers re-sign every retry with a fresh timestamp anyway.
Tolerance = Annotated[int, Field(ge=1, le=3600)]


class NoneConfig(BaseModel):
    """Deliveries are not signed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scheme: Literal["none"] = "none"


class SecretsConfig(BaseModel):
    """What every scheme with secrets has: the environment variables holding them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    secrets_env: tuple[str, ...] = ()

    @field_validator("secrets_env", mode="before")
    @classmethod
    def _one_name_is_a_list(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("secrets_env")
    @classmethod
    def _check_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            check_env_name(name)
        return names


class SignedConfig(SecretsConfig):
    """A scheme that always signs: at least one secret."""

    secrets_env: tuple[str, ...] = Field(min_length=1)


#: The options a preset's table may set, besides ``scheme`` and ``secrets_env``.
PRESET_OPTIONS = ("tolerance_s", "token", "organization_id", "verify_token_env")


class PresetConfig(SecretsConfig):
    """A sender preset (:mod:`.presets`): its scheme, the environment variables holding
    its secrets, and the options it takes."""

    scheme: str
    #: How far a signed timestamp may be from now (its default: the preset's).
    tolerance_s: Tolerance | None = None
    #: Where a ``token`` check reads the token: ``header:<name>`` or ``query:<name>``.
    token: str | None = None
    #: Salesforce: the organization ids whose messages are taken.
    organization_id: tuple[str, ...] = ()
    #: Meta: the environment variable holding the verify token of its GET handshake.
    verify_token_env: str | None = None

    @field_validator("organization_id", mode="before")
    @classmethod
    def _one_id_is_a_list(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("verify_token_env")
    @classmethod
    def _check_env(cls, name: str | None) -> str | None:
        return check_env_name(name, "verify_token_env: ")

    @field_validator("token")
    @classmethod
    def _check_token(cls, where: str | None) -> str | None:
        if where is not None and not where.startswith(("header:", "query:")):
            raise ValueError(f"token: write header:<name> or query:<name>, got {where!r}")
        return where if where is None else check_reference(where)

    @model_validator(mode="after")
    def _check_preset(self) -> PresetConfig:
        preset = PRESETS.get(self.scheme)
        if preset is None:
            known = ", ".join(sorted([*PRESETS, "hmac", "none"]))
            raise ValueError(f"unknown scheme {self.scheme!r} (known: {known})")
        if preset.needs_secrets and not self.secrets_env:
            raise ValueError(f"scheme {self.scheme!r} needs secrets_env (at least one)")
        allowed = set(preset.options)
        if (preset.layout is not None and preset.layout.timed) or preset.check in (
            "standard_webhooks",
        ):
            allowed.add("tolerance_s")
        if preset.check == "token":
            allowed.add("token")
        extra = sorted(set(PRESET_OPTIONS) & self.model_fields_set - allowed)
        if extra:
            raise ValueError(f"scheme {self.scheme!r} takes no {', '.join(extra)}")
        if preset.check == "token" and (self.token or preset.sent_in) is None:
            raise ValueError(
                f'scheme {self.scheme!r} needs token = "header:<name>" or "query:<name>"'
            )
        if preset.check == "salesforce" and not self.organization_id:
            raise ValueError("scheme 'salesforce' needs organization_id (your org's 00D... id)")
        return self

    @property
    def token_at(self) -> str:
        """Where a token check reads the token (this table's ``token``, else the preset's)."""
        where = self.token or PRESETS[self.scheme].sent_in
        assert where is not None
        return where

    @property
    def tolerance(self) -> int:
        """The tolerance of a signed timestamp, seconds."""
        return self.tolerance_s or PRESETS[self.scheme].tolerance_s


class StandardWebhooksConfig(PresetConfig):
    """Standard Webhooks / Svix: secrets are ``whsec_<base64>``."""

    scheme: Literal["standard_webhooks"] = "standard_webhooks"
    secrets_env: tuple[str, ...] = Field(min_length=1)
    tolerance_s: Tolerance | None = 300


class StripeConfig(PresetConfig):
    """Stripe: secrets are the endpoint's ``whsec_…`` signing secrets."""

    scheme: Literal["stripe"] = "stripe"
    secrets_env: tuple[str, ...] = Field(min_length=1)
    tolerance_s: Tolerance | None = 300


class GithubConfig(PresetConfig):
    """GitHub: secrets are the webhook's secret."""

    scheme: Literal["github"] = "github"
    secrets_env: tuple[str, ...] = Field(min_length=1)


class ShopifyConfig(PresetConfig):
    """Shopify: secrets are the app's client secret."""

    scheme: Literal["shopify"] = "shopify"
    secrets_env: tuple[str, ...] = Field(min_length=1)


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


#: The schemes with a class of their own (the rest are :class:`PresetConfig`).
_OWN_CLASSES = ("none", "hmac", "standard_webhooks", "stripe", "github", "shopify")


def _scheme_tag(value: Any) -> str:
    scheme = value.get("scheme") if isinstance(value, dict) else getattr(value, "scheme", None)
    return scheme if scheme in _OWN_CLASSES else "preset"


VerifyConfig: TypeAlias = Annotated[
    Annotated[NoneConfig, Tag("none")]
    | Annotated[HmacConfig, Tag("hmac")]
    | Annotated[StandardWebhooksConfig, Tag("standard_webhooks")]
    | Annotated[StripeConfig, Tag("stripe")]
    | Annotated[GithubConfig, Tag("github")]
    | Annotated[ShopifyConfig, Tag("shopify")]
    | Annotated[PresetConfig, Tag("preset")],
    Discriminator(_scheme_tag),
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

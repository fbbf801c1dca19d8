"""Twilio: ``X-Twilio-Signature`` = base64 HMAC-SHA1 (keyed with the account's auth token)
of the URL Twilio called followed by every POST parameter's name and value, sorted by
name (twilio 9.13, ``twilio/request_validator.py``).

* The URL is the public one (``KEYLANE_PUBLIC_URL`` or the source's ``public_url``, then
  the path and query as sent): never the ``Host`` header. Twilio's own validator also
  accepts the URL with its default port added or dropped, and so does this one.
* A JSON body is not in the signature: its SHA-256 is, as the URL's ``bodySHA256``
  parameter.
* ``X-Twilio-Webhooks-Signature-Settings: key=…,algorithm=HMAC_SHA256`` marks a request
  signed with HMAC-SHA256 (a shared key's) instead.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qsl, urlsplit

from ...routing.contract.errors import SignatureError
from ...routing.contract.presets import Algorithm
from .signing_keys import SecretInput, SigningKeys, decode_signature, utf8_key
from .verifier import (
    NO_TARGET,
    Target,
    Verified,
    lower_headers,
    malformed,
    no_match,
    require_header,
)

HEADER = "x-twilio-signature"
SETTINGS_HEADER = "x-twilio-webhooks-signature-settings"
#: The URL parameter that carries the SHA-256 of a body that is not a form.
BODY_SHA256 = "bodySHA256"
_DEFAULT_PORTS = {"https": 443, "http": 80}


class TwilioVerifier:
    """Verifies ``X-Twilio-Signature``."""

    name: str

    def __init__(self, secrets: Sequence[SecretInput]) -> None:
        self.name = "twilio"
        self._keys = SigningKeys(self.name, (utf8_key(s) for s in secrets))

    def __repr__(self) -> str:
        return f"TwilioVerifier(keys={len(self._keys)})"

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float, target: Target = NO_TARGET
    ) -> Verified:
        """Verified when a held auth token signed the URL and parameters."""
        lowered = lower_headers(headers)
        signature = decode_signature(require_header(lowered, HEADER), "base64")
        if signature is None:
            raise malformed(HEADER, "signature is not base64")
        if not target.url:
            raise SignatureError("twilio signs the URL it called: none is configured")
        algorithm = _algorithm(lowered.get(SETTINGS_HEADER, ""))
        expected_body = target.query.get(BODY_SHA256)
        if expected_body is not None:
            if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), expected_body.lower()):
                raise SignatureError("the body does not match its bodySHA256")
            params = b""
        else:
            params = signed_params(body, lowered.get("content-type", ""))
        for url in _url_variants(target.url):
            if self._keys.match(url.encode() + params, [signature], algorithm):
                return Verified(scheme=self.name, event_id=None, timestamp=None)
        raise no_match()


def _algorithm(settings: str) -> Algorithm:
    for item in settings.split(","):
        name, _, value = item.strip().partition("=")
        if name == "algorithm" and value.strip().upper() == "HMAC_SHA256":
            return "sha256"
    return "sha1"


def signed_params(body: bytes, content_type: str) -> bytes:
    """Each form parameter's name and value, sorted by name (a repeated name's values
    sorted too), as Twilio concatenates them; nothing for a body that is not a form."""
    if not content_type.lower().startswith("application/x-www-form-urlencoded"):
        return b""
    pairs = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
    return "".join(name + value for name, value in sorted(pairs)).encode()


def _url_variants(url: str) -> list[str]:
    """The URL as configured, and with its scheme's default port dropped or added."""
    parts = urlsplit(url)
    default = _DEFAULT_PORTS.get(parts.scheme)
    host = parts.hostname or ""
    if parts.port is None and default is not None:
        other = parts._replace(netloc=f"{parts.netloc}:{default}").geturl()
    elif parts.port == default:
        userinfo = parts.netloc.rpartition("@")[0]
        other = parts._replace(netloc=f"{userinfo}@{host}" if userinfo else host).geturl()
    else:
        return [url]
    return [url, other]

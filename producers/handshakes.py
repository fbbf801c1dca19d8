"""The handshakes senders send before (or besides) their events, answered by the receiver
itself, recording nothing: no event id is marked seen, nothing is queued or journaled.

* **Slack** ``url_verification`` and **Zoom** ``endpoint.url_validation``: signed like
  any delivery, answered only when the signature holds (:meth:`Handshakes.after_verify`):
  Slack's ``challenge`` echoed, Zoom's ``plainToken`` with its HMAC under the secret token.
* **monday.com**: ``{"challenge": ...}``, answered with the same JSON once the URL's
  token holds.
* **Meta**: a ``GET`` with ``hub.mode=subscribe``, ``hub.verify_token`` and
  ``hub.challenge``: the challenge as text when the verify token is the one in
  ``verify_token_env``, else 403.
* **Mailchimp**: a ``GET`` of the URL when the webhook is created: 200 once the URL's
  token holds.
* **Microsoft Graph**: ``POST ?validationToken=…``: the token as ``text/plain``. Graph's
  validation carries nothing to check it by; what it opens is only this echo.
* **Asana**: the first ``POST`` carries ``X-Hook-Secret``: kept in Redis (the first one
  only; a second is refused until an operator forgets the kept one) and echoed; later
  deliveries are checked with the secret Redis keeps when they come, whichever receiver
  kept it (:class:`~keylane.producers.signatures.KeptSecretVerifier`).
* **Notion**: the first ``POST`` is ``{"verification_token": ...}``, unsigned: kept as
  Asana's secret is and answered 200. The person setting the subscription up pastes the
  token into Notion's "Verify" (``keylane sources show-secret``), and Notion signs later
  deliveries with it. A token someone else sent first would not verify there: the
  subscription stays unverified until ``keylane sources forget-secret``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from ..routing.contract.errors import ConfigError, InvalidEvent
from ..routing.contract.signing import PresetConfig, load_secrets
from ..routing.contract.sources import SourceConfig, Sources
from .answers import Answer, error_answer, json_answer, text_answer
from .formats import parse_json
from .gateway import ReceiverGateway
from .signatures import KeptSecretVerifier, Verifier

#: The header that hands Asana's secret over (and echoes it back).
HANDOVER_HEADER = "x-hook-secret"
#: The header of Notion's signed deliveries (its handshake has none).
NOTION_SIGNATURE = "x-notion-signature"


def notion_token(headers: Mapping[str, str], body: bytes) -> str:
    """The ``verification_token`` of Notion's handshake, a JSON body with that one field
    and no signature; ``""`` when the request is not that handshake."""
    if headers.get(NOTION_SIGNATURE) or not body.lstrip().startswith(b"{"):
        return ""
    try:
        tree = parse_json(body)
    except InvalidEvent:
        return ""
    if not isinstance(tree, dict) or list(tree) != ["verification_token"]:
        return ""
    token = tree["verification_token"]
    return token.strip() if isinstance(token, str) else ""


class Handshakes:
    """The handshakes of a receiver's sources, with what they need to be answered: the
    secrets Zoom's answer is signed with, Meta's verify tokens, Asana's kept secrets (in
    Redis, through ``gateway``; None: nothing is kept, as in ``keylane sources try``)."""

    def __init__(
        self,
        sources: Sources,
        verifiers: Mapping[str, Verifier],
        environ: Mapping[str, str],
        gateway: ReceiverGateway | None,
    ) -> None:
        self.gateway = gateway
        self.verifiers = verifiers
        self._first_secret: dict[str, str] = {}
        self._verify_tokens: dict[str, str] = {}
        for source in sources.all():
            config = source.verify
            if source.handshake == "zoom" and isinstance(config, PresetConfig):
                self._first_secret[source.name] = load_secrets(config, environ)[
                    0
                ].get_secret_value()
            if source.handshake == "meta" and isinstance(config, PresetConfig):
                name = config.verify_token_env
                if name is not None:
                    token = environ.get(name, "")
                    if not token:
                        raise ConfigError(
                            f"source {source.name}: environment variable {name} "
                            "(verify_token_env) is not set"
                        )
                    self._verify_tokens[source.name] = token

    async def get(
        self, source: SourceConfig, query: Mapping[str, str], verified: bool
    ) -> Answer | None:
        """The answer to a ``GET`` of a source's webhook URL: Meta's subscription check
        (``verified`` unused: its proof is the verify token), Mailchimp's (only once the
        source's check, its URL token, held: ``verified``); None when the source has no
        ``GET`` handshake (405)."""
        if source.handshake == "meta":
            return self._meta(source, query)
        if source.handshake == "mailchimp" and verified:
            return json_answer(200, {"status": "ok", "source": source.name})
        return None

    def _meta(self, source: SourceConfig, query: Mapping[str, str]) -> Answer:
        expected = self._verify_tokens.get(source.name)
        if expected is None:
            return error_answer(
                403, "no_verify_token", f"source {source.name} has no verify_token_env"
            )
        if query.get("hub.mode") != "subscribe" or "hub.challenge" not in query:
            return error_answer(400, "not_a_handshake", "expected hub.mode=subscribe")
        offered = query.get("hub.verify_token", "")
        if not hmac.compare_digest(offered.encode(), expected.encode()):
            return error_answer(403, "bad_verify_token", "hub.verify_token is not this source's")
        return text_answer(200, query["hub.challenge"])

    async def before_verify(
        self,
        source: SourceConfig,
        headers: Mapping[str, str],
        query: Mapping[str, str],
        body: bytes = b"",
    ) -> Answer | None:
        """A handshake that comes before any signature can be checked (Graph's
        validation, Asana's secret, Notion's token), and the secret such a sender handed
        over earlier, held for its verifier; None when the request is no such handshake."""
        kind = source.handshake
        if kind == "graph" and "validationToken" in query:
            return text_answer(200, query["validationToken"])
        if kind == "asana":
            offered = headers.get(HANDOVER_HEADER, "").strip()
            # Asana wants its secret back in the answer's header.
            echo = [(HANDOVER_HEADER.encode(), offered.encode())]
            return await self._keep(source, offered, echo)
        if kind == "notion":
            token = notion_token(headers, body)
            if token and not isinstance(self.verifiers[source.name], KeptSecretVerifier):
                return Answer(200, b"", [])  # its token is in secrets_env: nothing to keep
            return await self._keep(source, token, [])
        return None

    async def _keep(
        self, source: SourceConfig, offered: str, echo: list[tuple[bytes, bytes]]
    ) -> Answer | None:
        """Keep the secret a handshake hands over (``offered``): None when it is not one
        (``""``: the secret kept earlier, if any, is held for the verifier), 409 when
        another is kept, else a 200 with no body and the ``echo`` headers."""
        verifier = self.verifiers[source.name]
        if not isinstance(verifier, KeptSecretVerifier) or self.gateway is None:
            return None  # its secrets are configured (or nothing is kept: sources try)
        if not offered:
            # Read for every delivery, not once: an operator may have forgotten the kept
            # secret since, and another receiver kept a new webhook's (one GET, Asana and
            # Notion only).
            verifier.hold(await self.gateway.kept_secret(source.name))
            return None
        kept = await self.gateway.keep_secret(source.name, offered)
        if not hmac.compare_digest(kept.encode(), offered.encode()):
            return error_answer(
                409,
                "secret_kept",
                f"source {source.name} keeps the secret of an earlier handshake; "
                f"`keylane sources forget-secret {source.name}` lets a new webhook hand "
                "over its own",
            )
        verifier.hold(kept)
        return Answer(200, b"", echo)

    def after_verify(self, source: SourceConfig, tree: Any) -> Answer | None:
        """A checked handshake (Slack's, Zoom's, monday's), answered once its check held; None
        when the delivery is an event."""
        if not isinstance(tree, dict):
            return None
        if source.handshake == "slack" and tree.get("type") == "url_verification":
            return json_answer(200, {"challenge": str(tree.get("challenge", ""))})
        if source.handshake == "monday" and list(tree) == ["challenge"]:
            return json_answer(200, {"challenge": str(tree["challenge"])})
        if source.handshake == "zoom" and tree.get("event") == "endpoint.url_validation":
            plain = (tree.get("payload") or {}).get("plainToken")
            if not isinstance(plain, str) or not plain:
                return error_answer(400, "not_a_handshake", "payload.plainToken is missing")
            secret = self._first_secret[source.name].encode()
            encrypted = hmac.new(secret, plain.encode(), hashlib.sha256).hexdigest()
            return json_answer(200, {"plainToken": plain, "encryptedToken": encrypted})
        return None

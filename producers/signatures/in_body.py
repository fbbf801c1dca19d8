"""Senders whose proof is in the body, not in a signature:

* Salesforce outbound messages carry the organization id of the org that sent them
  (``OrganizationId``): a message from any other org is refused. (Mutual TLS and an
  allowlist of Salesforce's addresses, in front of keylane, are what keep anyone else
  from copying an org id; the docs say so.)
* Microsoft Graph's notifications each carry the ``clientState`` given when the
  subscription was made: every one of a delivery's must be a held one.

Each reads the body with the hardened parsers of :mod:`keylane.producers.formats`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...routing.contract.errors import InvalidEvent, SignatureError
from ..formats import parse_json
from ..formats.xml_body import parse_xml
from .signing_keys import SecretInput, SigningKeys, utf8_key
from .verifier import NO_TARGET, Target, Verified


def _tree(read: Any, body: bytes) -> Any:
    try:
        return read(body)
    except InvalidEvent as exc:
        raise SignatureError(f"cannot read the body to check it: {exc}") from None


class SalesforceVerifier:
    """Verifies that an outbound message comes from one of ``organization_ids``."""

    name: str

    def __init__(self, organization_ids: Sequence[str]) -> None:
        self.name = "salesforce"
        # Salesforce writes the 18-character id; a 15-character one is its prefix.
        self.organization_ids = tuple(i.strip()[:15] for i in organization_ids)

    def __repr__(self) -> str:
        return f"SalesforceVerifier(organization_ids={self.organization_ids!r})"

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float, target: Target = NO_TARGET
    ) -> Verified:
        """Verified when the message's ``OrganizationId`` is the source's."""
        tree = _tree(parse_xml, body)
        try:
            found = tree["Envelope"]["Body"]["notifications"]["OrganizationId"]
        except (KeyError, TypeError):
            raise SignatureError("not a Salesforce outbound message (no OrganizationId)") from None
        if not isinstance(found, str) or found.strip()[:15] not in self.organization_ids:
            raise SignatureError("the message's OrganizationId is not this source's")
        return Verified(scheme=self.name, event_id=None, timestamp=None)


class GraphVerifier:
    """Verifies that every notification of a Graph delivery has a held ``clientState``."""

    name: str

    def __init__(self, secrets: Sequence[SecretInput]) -> None:
        self.name = "microsoft_graph"
        self._states = SigningKeys(self.name, (utf8_key(s) for s in secrets))

    def __repr__(self) -> str:
        return f"GraphVerifier(client_states={len(self._states)})"

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float, target: Target = NO_TARGET
    ) -> Verified:
        """Verified when each notification's ``clientState`` is a held one."""
        tree = _tree(parse_json, body)
        items = tree.get("value") if isinstance(tree, dict) else None
        if not isinstance(items, list):
            raise SignatureError("not a Graph notification collection (no value list)")
        for item in items:
            state = item.get("clientState") if isinstance(item, dict) else None
            if not isinstance(state, str) or not self._states.holds(state.encode()):
                raise SignatureError("a notification's clientState is not this source's")
        return Verified(scheme=self.name, event_id=None, timestamp=None)

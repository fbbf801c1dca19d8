"""A delivery keylane kept, run again: what stands in for its check and its body.

A kept delivery (``ops/rerun.py`` reads it) is run again through the receiver's own steps
(:meth:`~keylane.producers.receiver.Receiver.read`, then
:meth:`~keylane.producers.receiver.Receiver.admit`): read by its source's **current**
mapping, its events deduped on their ids and queued as any delivery's. Only its check is
not run again: it passed when it came (a delivery that did not is kept without its body,
and cannot be run again), and cannot pass now (its signed timestamp is past its tolerance,
its signature header was redacted when it was kept). :class:`KeptCheck` vouches for what
the check vouched for then: the scheme, and the event id its headers carry.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from ..routing.contract.signing import HmacConfig
from ..routing.contract.sources import SourceConfig
from .body import Receive
from .signatures import NO_TARGET, Target, Verified
from .signatures.standard_webhooks import ID_HEADER


def id_header(source: SourceConfig) -> str | None:
    """The header a source's event id is read from, when it is one: the scheme's
    (``event_id = "signature"``: GitHub's ``X-GitHub-Delivery``, Standard Webhooks'
    ``webhook-id``) or the one its ``event_id`` names (``header:<name>``)."""
    rule = source.event_id_rule
    if rule.startswith("header:"):
        return rule.removeprefix("header:")
    if rule != "signature":
        return None
    if isinstance(source.verify, HmacConfig):
        return source.verify.event_id_header
    preset = source.preset
    if preset is not None and preset.layout is not None:
        return preset.layout.event_id_header
    return ID_HEADER


class KeptCheck:
    """The check a kept delivery passed when it came (see the module docstring)."""

    name = "kept"

    def __init__(self, source: SourceConfig) -> None:
        self.scheme = str(source.verify.scheme)
        header = id_header(source) if source.event_id_rule == "signature" else None
        self.id_header = header.lower() if header is not None else None

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float, target: Target = NO_TARGET
    ) -> Verified:
        """What the delivery's check vouched for when it came."""
        event_id = headers.get(self.id_header, "").strip() if self.id_header else ""
        return Verified(self.scheme, event_id or None, None)


def body_of(body: bytes) -> Receive:
    """A kept body as the receiver reads a request's: whole, in one message."""

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive

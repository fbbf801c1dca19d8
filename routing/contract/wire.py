"""Versions of what keylane keeps between its processes: the wire format of the shard
queues' messages, and the layout of its Redis keys (CHANGELOG.md, "Upgrading").

**The wire format.** A message names its version in the header :data:`WIRE_HEADER`;
a message without it is version 1, what keylane 0.1.0 wrote. Each version is the one
before it plus the event fields :data:`FIELDS_SINCE` names:

* 1 (0.1.0): the fields of :data:`V1_FIELDS`, no version header;
* 2 (0.2.0): the same fields, the version header, and ``delivery`` (the id of the
  delivery an event came from) and ``request`` (what is kept of it,
  :mod:`.kept_deliveries`). Those two are only kept, never applied: an event for a worker
  that reads version 1 goes without them (:data:`KEPT_ONLY`) rather than wait.

A worker reads every version in :data:`READS`; a message of another version is parked
for review (a ``wire_version`` dead letter that holds its record, the message kept whole
so that ``keylane dlq retry`` queues it again once a worker that reads it runs), never
dropped. A producer writes the newest version every live worker reads
(:func:`for_version`): a worker's membership beat says which it reads (``wire`` in its
member info; a worker of 0.1.0 says nothing: version 1), so that during a rolling upgrade
no worker meets a message it cannot read. An event that needs a newer version than a
live worker reads is not written at all: the receiver answers 503 and the sender retries.

Every field of :class:`~keylane.routing.contract.events.Event` must be in
:data:`V1_FIELDS` or :data:`FIELDS_SINCE` (``tests/test_wire_versions.py``): a field
added without a version would reach a worker of an older release, whose model forbids
unknown fields, and make every event a ``malformed`` dead letter there.

**The Redis layout.** :data:`LAYOUT_VERSION` is written to the namespace's ``layout``
key by the first worker that finds none (a namespace of 0.1.0 has none: layout 1); a
worker refuses to start on a namespace laid out by a newer release.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import BrokerUnavailable

#: The wire version this release writes, and the ones its workers read.
WIRE_VERSION = 2
READS = (1, 2)
#: The message header that names a message's wire version (absent: 1).
WIRE_HEADER = "keylane_wire"

#: The event fields of wire version 1 (keylane 0.1.0, commit 44bfee1).
V1_FIELDS = frozenset(
    {
        "source",
        "event_id",
        "event_type",
        "record_key",
        "changes",
        "body_sha256",
        "accepted_at",
        "shard",
        "key_missing",
        "retry_of",
        "review",
        "destination",
        "payload",
        "body",
        "conditions",
        "if_revision",
        "identities",
        "merge",
        "via",
    }
)
#: Event fields added since version 1: field -> the first wire version that has it.
FIELDS_SINCE: Mapping[str, int] = {"delivery": 2, "request": 2}
#: Fields an older worker's event goes without, even when set: what they carry is kept
#: for people to look at, and changes no outcome.
KEPT_ONLY = frozenset({"delivery", "request"})

#: The Redis layout this release writes and reads (the ``layout`` key; absent: 1).
LAYOUT_VERSION = 1


class NeedsNewerWire(BrokerUnavailable):
    """An event uses a field that the wire version a live worker reads does not have: it
    cannot be queued until that worker is upgraded (the receiver answers 503)."""


def version_of(headers: Mapping[str, Any]) -> int | None:
    """A message's wire version from its headers (1 when it names none); None when the
    header is there but not a version number (then no worker reads it)."""
    value = headers.get(WIRE_HEADER, 1)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def for_version(event: Mapping[str, Any], version: int, defaults: Mapping[str, Any]) -> Any:
    """``event`` (its wire form) as wire ``version`` carries it: the fields that version
    does not have left out while they are at their default (``defaults``), else
    :class:`NeedsNewerWire`. The newest version takes the event as it is."""
    if version >= WIRE_VERSION:
        return event
    newer = [name for name, since in FIELDS_SINCE.items() if since > version and name in event]
    if not newer:
        return event
    used = [n for n in newer if n not in KEPT_ONLY and event[n] != defaults.get(n)]
    if used:
        raise NeedsNewerWire(
            f"the event uses {', '.join(sorted(used))}, which workers reading wire version "
            f"{version} do not know"
        )
    return {name: value for name, value in event.items() if name not in newer}


def wire_of_member(info: Mapping[str, Any]) -> int:
    """The newest wire version a worker reads, from its member info (0.1.0: none said)."""
    value = info.get("wire", 1)
    return value if isinstance(value, int) and value >= 1 else 1

"""Events as they travel from the receiver to a lane, and the changes they carry.

A change names fields and one operation per field::

    {"email": {"set": "a@b.c"}, "visits": {"increment": 1}, "tags": {"add": "vip"}}

Operations: ``set``, ``unset``, ``increment``, ``append``, ``add`` and ``remove``
(``add``/``remove`` treat a list as a set of JSON values).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from .conditions import WireConditions, check_conditions, check_if_revision
from .identities import Merge, check_identities

# The value rules live in .values; they are named here too, where changes have used them.
from .values import MAX_FIELD_CHARS as MAX_FIELD_CHARS
from .values import check_field_name as check_field_name
from .values import check_json_value as check_json_value
from .values import check_text as check_text
from .values import is_number

Op = Literal["set", "unset", "increment", "append", "add", "remove"]
OPS: tuple[str, ...] = get_args(Op)

MAX_ID_CHARS = 255
MAX_KEY_CHARS = 512
MAX_FIELDS = 256


class Change(BaseModel):
    """One operation on one field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: Op
    value: Any = None

    @classmethod
    def parse(cls, field: str, raw: object) -> Change:
        """Read ``{"<op>": value}`` as sent in an envelope; ``ValueError`` says what is wrong."""
        op, value = check_change(field, raw)
        return cls(op=op, value=value)

    def as_wire(self) -> dict[str, Any]:
        """The ``{"<op>": value}`` form."""
        return {self.op: True if self.op == "unset" else self.value}


def check_change(field: str, raw: object) -> tuple[str, Any]:
    """The operation and value of one change, ``{"<op>": value}`` as sent (the rules of a
    change, for :meth:`Change.parse` and :func:`wire_changes`); ``ValueError`` says what
    is wrong."""
    if not isinstance(raw, dict) or len(raw) != 1:
        raise ValueError(f"field {field!r}: a change is an object with exactly one operation")
    ((op, value),) = raw.items()
    if op not in OPS:
        raise ValueError(f"field {field!r}: unknown operation {op!r} (known: {', '.join(OPS)})")
    if op == "increment" and not is_number(value):
        raise ValueError(f"field {field!r}: increment needs a finite number")
    if op == "unset":
        if value not in (True, None):
            raise ValueError(f"field {field!r}: unset takes true or null")
        return op, None
    if type(value) is not int:  # the common case, a plain number, needs no walk
        check_json_value(value, f"field {field!r}")
    return op, value


def check_changes(raw: object) -> dict[str, tuple[str, Any]]:
    """Validate a ``changes`` object: each field's operation and value; ``ValueError``
    names the first problem."""
    if not isinstance(raw, dict) or not raw:
        raise ValueError("changes must be a non-empty object of field -> operation")
    if len(raw) > MAX_FIELDS:
        raise ValueError(f"at most {MAX_FIELDS} fields may change in one event")
    out: dict[str, tuple[str, Any]] = {}
    for field, change in raw.items():
        check_field_name(field)
        out[field] = check_change(field, change)
    return out


def parse_changes(raw: object) -> dict[str, Change]:
    """Validate a ``changes`` object into :class:`Change` values; ``ValueError`` names
    the first problem."""
    return {field: Change(op=op, value=value) for field, (op, value) in check_changes(raw).items()}


def wire_changes(raw: object) -> dict[str, dict[str, Any]]:
    """Validate a ``changes`` object into the form an :class:`Event` carries it in its
    message (``{"op", "value"}`` per field, as ``Event.model_dump`` writes it), without
    building models; ``ValueError`` names the first problem."""
    return {field: {"op": op, "value": value} for field, (op, value) in check_changes(raw).items()}


def check_event_id(text: object, what: str = "the event id") -> str:
    """An event id as every store and Redis key can hold it: text of 1 to
    :data:`MAX_ID_CHARS` characters (see :func:`check_text`); ``ValueError`` otherwise."""
    return _bounded_text(text, what, MAX_ID_CHARS)


def check_record_key(text: object, what: str = "the record key") -> str:
    """A record key: text of 1 to :data:`MAX_KEY_CHARS` characters (see
    :func:`check_text`); ``ValueError`` otherwise."""
    return _bounded_text(text, what, MAX_KEY_CHARS)


def _bounded_text(text: object, what: str, most: int) -> str:
    if type(text) is not str:
        raise ValueError(f"{what} must be text")
    if not 0 < len(text) <= most:
        raise ValueError(f"{what} must be 1..{most} characters")
    return check_text(text, what)


#: The keys of keylane's own envelope.
ENVELOPE_KEYS = frozenset(
    {"id", "type", "record_key", "changes", "conditions", "if_revision", "also"}
)


@dataclass(frozen=True)
class Envelope:
    """keylane's own delivery format (the ``demo`` source and ``format = "keylane"``):
    ``{"id", "type", "record_key", "changes"}``, ``id`` and ``type`` optional, and the
    optional ``conditions`` and ``if_revision`` (:mod:`.conditions`) and ``also``: the
    record's other identities (:mod:`.identities`), in their normal form."""

    id: str | None
    type: str
    record_key: str
    changes: dict[str, dict[str, Any]]  # as :func:`wire_changes` gives them
    conditions: WireConditions | None = None
    if_revision: int | None = None
    identities: tuple[str, ...] = ()

    @classmethod
    def read(cls, payload: object) -> Envelope:
        """The envelope in a parsed body; ``ValueError`` names the key and the problem."""
        if not isinstance(payload, dict):
            raise ValueError("the body must be a JSON object: keylane's envelope")
        if not payload.keys() <= ENVELOPE_KEYS:
            unknown = ", ".join(sorted(map(repr, payload.keys() - ENVELOPE_KEYS)))
            raise ValueError(f"unknown key(s) {unknown}: the envelope has {_ENVELOPE_HELP}")
        event_id = payload.get("id")
        if event_id is not None:
            event_id = check_event_id(event_id, "id")
        event_type = _bounded_text(payload.get("type", "event"), "type", MAX_ID_CHARS)
        if "record_key" not in payload:
            raise ValueError("record_key is missing")
        record_key = check_record_key(payload["record_key"], "record_key")
        if "changes" not in payload:
            raise ValueError("changes is missing")
        try:
            changes = wire_changes(payload["changes"])
        except ValueError as exc:
            raise ValueError(f"changes: {exc}") from None
        conditions, if_revision = read_conditions(payload)
        try:
            identities = check_identities(payload.get("also", []))
        except ValueError as exc:
            raise ValueError(f"also: {exc}") from None
        return cls(event_id, event_type, record_key, changes, conditions, if_revision, identities)


def read_conditions(payload: dict[str, Any]) -> tuple[WireConditions | None, int | None]:
    """The ``conditions`` and ``if_revision`` of an envelope (or a hook's result), each
    None when absent; ``ValueError`` names the field and operator that are wrong."""
    conditions = payload.get("conditions")
    if conditions is not None:
        try:
            conditions = check_conditions(conditions)
        except ValueError as exc:
            raise ValueError(f"conditions: {exc}") from None
    if_revision = payload.get("if_revision")
    if if_revision is not None:
        if_revision = check_if_revision(if_revision)
    return conditions, if_revision


_ENVELOPE_HELP = "id, type, record_key, changes, conditions, if_revision and also"


class Event(BaseModel):
    """An accepted event, as queued for its record's lane."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    event_id: str
    event_type: str
    record_key: str
    changes: dict[str, Change]
    body_sha256: str
    accepted_at: float
    shard: int
    key_missing: bool = False  # the sender gave no id: event_id is synthetic
    retry_of: int | None = None  # dead-letter id when an operator retries the event
    review: str | None = None  # set on a review-only message: record, never apply
    destination: str | None = None  # a task or destination runs it, not keylane's records
    payload: Any = None  # what a task or destination gets: the delivery's JSON body
    #: A forwarded delivery's body as it came (JSON text): what an HTTP forward sends.
    #: A message that carries it carries no ``payload``: it is read from the body.
    body: str | None = None
    #: What must hold on the record for the change to apply (:mod:`.conditions`), as
    #: checked; unmet, the event is refused.
    conditions: WireConditions | None = None
    #: The record's revision the sender read: the change applies only at that revision.
    if_revision: int | None = None
    #: The record's other names (``kind:value``, normal form, :mod:`.identities`): the
    #: lane claims them for the record in the write's transaction, and proposes a merge
    #: when one already names another record.
    identities: tuple[str, ...] = ()
    #: A merge step (its source is ``keylane.merge``): the lane closes or absorbs.
    merge: Merge | None = None
    #: The record key the sender named, when the event was forwarded to the record that
    #: absorbed it.
    via: str | None = None
    #: The id of the delivery it came from (``SOURCE/MS-SEQ``, :mod:`.kept_deliveries`).
    delivery: str | None = None
    #: That delivery's request, carried when its source keeps deliveries (the lane keeps
    #: it in the store when the source's window keeps the event's outcome).
    request: dict[str, Any] | None = None

    @property
    def conditional(self) -> bool:
        """Whether the event carries conditions (or an ``if_revision``)."""
        return self.conditions is not None or self.if_revision is not None

    @property
    def idempotency_key(self) -> str:
        """The key a destination sees on every call for this event, retries and
        redeliveries included: ``<source>/<event id>``."""
        return f"{self.source}/{self.event_id}"

    @field_validator("source", "event_id", "event_type", "record_key")
    @classmethod
    def _storable(cls, text: str) -> str:
        return check_text(text, "the value")

    @model_validator(mode="before")
    @classmethod
    def _payload_from_body(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("payload") is None and data.get("body"):
            return {**data, "payload": json.loads(data["body"])}
        return data

    def changes_wire(self) -> dict[str, dict[str, Any]]:
        """The changes in envelope form, for review rows and logs."""
        return {field: change.as_wire() for field, change in self.changes.items()}


#: Every field of an event's wire form that has a default, at its default (all immutable):
#: a wire form built from parts (:func:`keylane.producers.accept.new_event`) starts from
#: these, so a field added to :class:`Event` with a default is never missing from it.
WIRE_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        name: info.get_default(call_default_factory=True)
        for name, info in Event.model_fields.items()
        if not info.is_required()
    }
)

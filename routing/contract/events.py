"""Events as they travel from the receiver to a lane, and the changes they carry.

A change names fields and one operation per field::

    {"email": {"set": "a@b.c"}, "visits": {"increment": 1}, "tags": {"add": "vip"}}

Operations: ``set``, ``unset``, ``increment``, ``append``, ``add`` and ``remove``
(``add``/``remove`` treat a list as a set of JSON values).
"""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

Op = Literal["set", "unset", "increment", "append", "add", "remove"]
OPS: tuple[str, ...] = get_args(Op)

MAX_ID_CHARS = 255
MAX_KEY_CHARS = 512
MAX_FIELD_CHARS = 128
MAX_FIELDS = 256


class Change(BaseModel):
    """One operation on one field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: Op
    value: Any = None

    @classmethod
    def parse(cls, field: str, raw: object) -> Change:
        """Read ``{"<op>": value}`` as sent in an envelope; ``ValueError`` says what is wrong."""
        if not isinstance(raw, dict) or len(raw) != 1:
            raise ValueError(f"field {field!r}: a change is an object with exactly one operation")
        ((op, value),) = raw.items()
        if op not in OPS:
            raise ValueError(f"field {field!r}: unknown operation {op!r} (known: {', '.join(OPS)})")
        if op == "increment" and not _is_number(value):
            raise ValueError(f"field {field!r}: increment needs a finite number")
        if op == "unset" and value not in (True, None):
            raise ValueError(f"field {field!r}: unset takes true or null")
        check_json_value(value, f"field {field!r}")
        return cls(op=op, value=None if op == "unset" else value)

    def as_wire(self) -> dict[str, Any]:
        """The ``{"<op>": value}`` form."""
        return {self.op: True if self.op == "unset" else self.value}


def _is_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not (isinstance(value, float) and not math.isfinite(value))


def check_text(text: str, what: str, allow_nul: bool = False) -> str:
    """``text`` if every store can keep it: no lone surrogate (not encodable as UTF-8) and,
    for what is stored as a text column (ids, keys, field names), no NUL, which PostgreSQL
    refuses. Inside JSON values a NUL is fine: JSON writes it as ``\u0000``. Raises
    ``ValueError`` naming ``what``."""
    if not allow_nul and "\x00" in text:
        raise ValueError(f"{what} contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid Unicode (a lone surrogate)") from None
    return text


def check_json_value(value: Any, what: str) -> None:
    """Refuse what JSON cannot carry faithfully: NaN/Infinity anywhere (``json.loads``
    reads them, JSON has no such numbers) and text that is not valid Unicode."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{what}: numbers must be finite (no NaN or Infinity)")
        if isinstance(item, str):
            check_text(item, what, allow_nul=True)
        elif isinstance(item, dict):
            for key, inner in item.items():
                check_text(str(key), what, allow_nul=True)
                stack.append(inner)
        elif isinstance(item, list):
            stack.extend(item)


def parse_changes(raw: object) -> dict[str, Change]:
    """Validate a ``changes`` object; ``ValueError`` names the first problem."""
    if not isinstance(raw, dict) or not raw:
        raise ValueError("changes must be a non-empty object of field -> operation")
    if len(raw) > MAX_FIELDS:
        raise ValueError(f"at most {MAX_FIELDS} fields may change in one event")
    out: dict[str, Change] = {}
    for field, change in raw.items():
        check_field_name(field)
        out[field] = Change.parse(field, change)
    return out


def check_field_name(field: object) -> None:
    """Field names are short, printable and non-empty."""
    if not isinstance(field, str) or not field or len(field) > MAX_FIELD_CHARS:
        raise ValueError(f"field names are 1..{MAX_FIELD_CHARS} characters")
    if any(ord(c) < 32 for c in field):
        raise ValueError(f"field name {field!r} has control characters")
    check_text(field, "a field name")


class Envelope(BaseModel):
    """keylane's own delivery format (the ``demo`` source and programmatic producers)."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(None, min_length=1, max_length=MAX_ID_CHARS)
    type: str = Field("event", min_length=1, max_length=MAX_ID_CHARS)
    record_key: str = Field(min_length=1, max_length=MAX_KEY_CHARS)
    changes: dict[str, Change]

    @field_validator("changes", mode="before")
    @classmethod
    def _parse_changes(cls, raw: object) -> dict[str, Change]:
        return parse_changes(raw)

    @field_validator("id", "type", "record_key")
    @classmethod
    def _storable(cls, text: str | None) -> str | None:
        return text if text is None else check_text(text, "the value")


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

    @property
    def idempotency_key(self) -> str:
        """The key a destination sees on every call for this event, retries and
        redeliveries included: ``<source>/<event id>``."""
        return f"{self.source}/{self.event_id}"

    @field_validator("source", "event_id", "event_type", "record_key")
    @classmethod
    def _storable(cls, text: str) -> str:
        return check_text(text, "the value")

    def changes_wire(self) -> dict[str, dict[str, Any]]:
        """The changes in envelope form, for review rows and logs."""
        return {field: change.as_wire() for field, change in self.changes.items()}

"""The fields a source may write (``owns``) and how its mapping changes one (``on``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from .events import OPS
from .mapping import is_reference


@dataclass(frozen=True)
class FieldOwnership:
    """The fields a source may write: a set of names, or every field (``*``)."""

    fields: frozenset[str] = frozenset()
    everything: bool = False

    @classmethod
    def of(cls, names: Iterable[str]) -> FieldOwnership:
        """``["*"]`` owns every field; otherwise exactly the names given."""
        names = list(names)
        if "*" in names:
            return cls(everything=True)
        return cls(fields=frozenset(names))

    def not_owned(self, names: Iterable[str]) -> list[str]:
        """The names among ``names`` that this ownership does not cover."""
        if self.everything:
            return []
        return sorted(n for n in names if n not in self.fields)


ALL_FIELDS = FieldOwnership(everything=True)


class FieldRule(BaseModel):
    """One field's change in a mapping: ``{increment = "body:amount"}``, ``{set = "x"}``.

    A string that starts with ``body:`` or ``header:`` is read from the delivery; any
    other value is a literal. A reference that is absent in a delivery leaves the field
    out of that event's change.
    """

    model_config = ConfigDict(frozen=True)

    op: str
    value: Any = None

    @model_validator(mode="before")
    @classmethod
    def _one_op(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and "op" not in raw:
            if len(raw) != 1:
                raise ValueError('a field rule has exactly one operation, e.g. {set = "body:x"}')
            ((op, value),) = raw.items()
            raw = {"op": op, "value": value}
        return raw

    @field_validator("op")
    @classmethod
    def _known_op(cls, op: str) -> str:
        if op not in OPS:
            raise ValueError(f"unknown operation {op!r} (known: {', '.join(OPS)})")
        return op

    @property
    def reference(self) -> str | None:
        """The reference the value is read from, or None for a literal."""
        return self.value if is_reference(self.value) else None

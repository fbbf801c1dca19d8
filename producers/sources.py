"""Source definitions: who may send, which fields each sender owns, how long ids are kept.

With no sources file, one source exists: ``demo``, unsigned, taking keylane's own
envelope and owning every field.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workers.changes import FieldOwnership
from workers.settings import Settings

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


class SourceConfig(BaseModel):
    """One sender."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    owns: tuple[str, ...] = ("*",)
    retention_s: int | None = Field(None, ge=1)
    on_dead_letter: Literal["continue", "hold"] = "continue"

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError(f"source names are lowercase [a-z0-9_.-], 1..64 chars: {name!r}")
        return name

    @property
    def ownership(self) -> FieldOwnership:
        """The fields this source may write."""
        return FieldOwnership.of(self.owns)

    def retention(self, settings: Settings) -> int:
        """Seconds a delivered event id is remembered in Redis."""
        return self.retention_s or settings.dedupe_retention_s


DEMO = SourceConfig(name="demo")


class Sources:
    """The configured sources, by name."""

    def __init__(self, sources: list[SourceConfig]) -> None:
        self._by_name = {s.name: s for s in sources}

    def get(self, name: str) -> SourceConfig | None:
        """The source called ``name``, if configured."""
        return self._by_name.get(name)

    def names(self) -> list[str]:
        """Every configured source name."""
        return sorted(self._by_name)


def load_sources(settings: Settings) -> Sources:
    """The sources of this deployment (the ``demo`` source when no file is configured)."""
    return Sources([DEMO])

"""How a deployment applies its events (from its settings and sources): what the write
discipline (:mod:`keylane.workers.apply`) and the merge steps (:mod:`keylane.workers.merges`)
are given."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..routing import ShardMap
from ..routing.contract.faults import NO_FAULTS, Faults


@dataclass(frozen=True)
class ApplyRules:
    """How a deployment applies its events (from its settings)."""

    #: Attempts (a fresh read each) before a conflict on every one makes a dead letter.
    max_attempts: int
    #: The deployment's shards: where a merge step or a forwarded event goes.
    shards: ShardMap
    #: The most one attempt's handler calls may take together.
    handler_time_limit_s: float = 10.0
    #: Faults injected at named points (crash tests only).
    faults: Faults = NO_FAULTS
    #: Each field some source owns by name -> those sources: whose value wins a merge.
    field_owners: Mapping[str, frozenset[str]] = field(default_factory=dict)

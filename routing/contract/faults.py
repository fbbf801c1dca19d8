"""Named fault points for crash and conflict tests. Inert unless ``KEYLANE_FAULTS`` is set.

A fault is declared as JSON, e.g.::

    KEYLANE_FAULTS='[{"point": "receiver.before_enqueue", "action": "kill", "times": 1}]'

Actions: ``kill`` (SIGKILL this process: a crash at exactly that point), ``sleep``,
``raise`` (a :class:`InjectedFault`) and ``bump`` (an outside write that advances the
record's revision, the way a person editing the CRM at that instant would).

Which fault fires where, and how often, is decided here; the kill itself is the process's:
each side hands :class:`Faults` its own ``crash`` (``producers/faults.py``,
``workers/faults.py``), so the contract signals no process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .errors import InjectedFault
from .settings import FaultSpec

log = logging.getLogger("keylane.faults")


class Faults:
    """The faults configured for this process; ``crash`` ends it at a ``kill`` fault."""

    def __init__(self, specs: Sequence[FaultSpec], crash: Callable[[], object]) -> None:
        self._specs = list(specs)
        self._crash = crash
        self._fired: dict[int, int] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._specs)

    def hit(
        self,
        point: str,
        record_key: str = "",
        bump: Callable[[], Any] | None = None,
    ) -> None:
        """Run the faults declared for ``point`` (and ``record_key``), if any."""
        if not self._specs:
            return
        for index, spec in enumerate(self._specs):
            if spec.point != point or not self._take(index, spec, record_key):
                continue
            # Logged before it acts, so a test can wait for a fault to be under way
            log.warning("fault injected: %s at %s (%s)", spec.action, point, record_key)
            if spec.action == "kill":
                self._crash()
            elif spec.action == "sleep":
                time.sleep(spec.sleep_ms / 1000)
            elif spec.action == "raise":
                raise InjectedFault(f"fault injected at {point}")
            elif spec.action == "bump" and bump is not None:
                bump()

    def _take(self, index: int, spec: FaultSpec, record_key: str) -> bool:
        if spec.match is not None and not record_key.startswith(spec.match):
            return False
        with self._lock:
            fired = self._fired.get(index, 0)
            if spec.times is not None and fired >= spec.times:
                return False
            self._fired[index] = fired + 1
        return True


#: No fault fires (so it has nothing to crash).
NO_FAULTS = Faults((), crash=lambda: None)

"""How a worker (or ``keylane journal prune``) dies at a ``kill`` fault (``KEYLANE_FAULTS``;
which fault fires where is :mod:`keylane.routing.contract.faults`'s)."""

from __future__ import annotations

import os
import signal


def crash() -> None:
    """SIGKILL this process: a crash at exactly the fault's point, nothing cleaned up."""
    os.kill(os.getpid(), signal.SIGKILL)

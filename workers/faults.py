"""How a worker (or ``keylane journal prune``) dies at a ``kill`` fault, and what a
``bump`` fault does before a record's write (``KEYLANE_FAULTS``; which fault fires where is
:mod:`keylane.routing.contract.faults`'s)."""

from __future__ import annotations

import contextlib
import os
import signal

from ..routing.contract.errors import VersionConflict
from ..routing.contract.faults import Faults
from .store import RecordStore


def crash() -> None:
    """SIGKILL this process: a crash at exactly the fault's point, nothing cleaned up."""
    os.kill(os.getpid(), signal.SIGKILL)


def before_write(store: RecordStore, faults: Faults, point: str, record_key: str) -> None:
    """(Blocking.) The faults at ``point``, just before a write to ``record_key``: there a
    ``bump`` is an outside write that leaves the fields as they are but advances the
    revision, so the write meets a version conflict."""
    faults.hit(point, record_key, bump=lambda: _bump(store, record_key))


def _bump(store: RecordStore, record_key: str) -> None:
    record = store.read(record_key)
    with contextlib.suppress(VersionConflict):
        store.write_outside(record_key, record.fields, record.revision)

"""A repair sweep: read keylane's store page by page, ask the repair's check about each
record, and send a repair event into the lane of each record it would change.

The sweep never writes a record. What it reads is only a hint: the record may change
between the read and the repair, and may be in the middle of a burst of edits. The
repair event goes behind the record's other events in its lane, where the lane reads the
record fresh and asks the check again (:func:`~keylane.workers.jobs.recheck`):
the change applied is computed from the record as it is then, after every event accepted
before the repair, and is written under the revision check like any event. A record
that no longer needs repairing gets no change.
"""

from __future__ import annotations

from ..routing.contract.errors import InvalidEvent
from ..routing.contract.schedules import JobSpec, RecordReader
from .runs import Run

#: Records read per page (each page is a read of its own; no long transaction).
SWEEP_PAGE = 500


def sweep(run: Run, repair: JobSpec, read: RecordReader) -> None:
    """Sweep the records of ``repair`` (its ``prefix``), sending a repair event for each
    one its check would change. Runs in a thread of its own: the reads block."""
    after = ""
    while True:
        run.check()
        page = read(repair.prefix, after, SWEEP_PAGE)
        for record in page:
            wanted = repair.fn(record)
            if not wanted:
                continue
            try:
                run.change(record.key, wanted)
            except InvalidEvent as exc:
                raise InvalidEvent(f"repair {repair.name} on {record.key}: {exc}") from exc
        if len(page) < SWEEP_PAGE:
            return
        after = page[-1].key

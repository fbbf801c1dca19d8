"""How a lane's turn on one record ends, in the broker: the acknowledgement of its
outcomes (the shard's next record taken and read in the same call, the record held behind
a dead letter when its source's policy is ``hold``), a wait (the record's list waits, its
shard's timer rings then), or the review row of a message that is no event this worker
can read, acknowledged. Which of them a record gets is decided by
:class:`keylane.workers.lane_record.RecordLane`.

Each is fenced by the shard's lease: when the lease changed meanwhile, the shard is
dropped (:meth:`keylane.workers.ownership.Ownership.lost`) and the record left for its
next owner.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..routing.contract.errors import StaleFence
from .blocking import BlockingPool
from .broker import Ack, Counts, Idle, Lease, RecordQueue, Taken
from .doorbell import Doorbell
from .lane_steps import Step, read_taken
from .ownership import Ownership
from .store import DeadLetterStore, RecordStore
from .store_rows import Fence

log = logging.getLogger("keylane.lanes")


class RecordFinish:
    """The broker calls that end a lane's turn on a record (see the module docstring),
    each made in a pool thread of ``io``."""

    def __init__(
        self, queue: RecordQueue, ownership: Ownership, io: BlockingPool, doorbell: Doorbell
    ) -> None:
        self.queue = queue
        self.ownership = ownership
        self.io = io
        self.doorbell = doorbell

    async def acknowledge(
        self, lease: Lease, taken: Taken, acks: list[Ack], hold: int | None, then_take: bool
    ) -> Step | Idle | None:
        """Acknowledge ``acks`` (holding the record behind the dead letter ``hold``); with
        ``then_take``, the shard's next record, taken and read in the same call
        (:class:`Idle` when none is due)."""
        finished = await self.io.store(
            lambda store: self._finish(store, store, lease, taken, acks, hold, then_take)
        )
        if finished is False:
            self.ownership.lost(lease, "lease changed before the acknowledgement")
        return finished if isinstance(finished, Step | Idle) else None

    def _finish(
        self,
        records: RecordStore,
        rows: DeadLetterStore,
        lease: Lease,
        taken: Taken,
        acks: list[Ack],
        hold: int | None,
        then_take: bool,
    ) -> Step | Idle | bool:
        """(In a pool thread.) Acknowledge; with ``then_take``, also take the shard's next
        record and read it from ``records``: one broker call and one read. After a hold,
        the holding row is read again (``rows``): if an operator closed it meanwhile, the
        release they could not send yet goes now."""
        nxt = self.queue.finish(lease, taken, acks, hold, then_take)
        if hold is not None and nxt is not False:
            self._release_if_closed(rows, lease, taken.record_key, hold)
        if not isinstance(nxt, Taken):
            return nxt
        return read_taken(records, nxt)

    def _release_if_closed(self, rows: DeadLetterStore, lease: Lease, key: str, hold: int) -> None:
        """(In a pool thread, after a hold.) If an operator closed the holding row while
        the hold was being written, send the release they could not. A failure here
        leaves the record held behind a closed row until ``dlq discard/resolve`` is run
        on it again (which sends the release): logged, never in the lane's way."""
        try:
            row = rows.dead_letter(hold)
            if row is None or row.status in ("open", "retried"):
                return
            self.queue.release_closed(lease, key, hold)
        except Exception as exc:
            log.warning("%s: could not check dead letter %s after the hold: %s", key, hold, exc)
            return
        log.info("%s: dead letter %s was closed while it held the record: released", key, hold)

    async def wait(
        self,
        lease: Lease,
        taken: Taken,
        delay_s: float,
        why: dict[str, Any],
        counts: Counts,
        since: float | None = None,
    ) -> None:
        """``taken``'s record waits ``delay_s`` from ``since`` (``time.monotonic()``, default
        now: a destination's answer, a failure), and its shard's timer rings then."""
        messages = [taken.raw] if counts != "keep" else []
        if since is not None:  # what the calls since then took is not waited again
            delay_s = max(0.0, delay_s - (time.monotonic() - since))
        waiting = await self.io.call(self.queue.wait, lease, taken, delay_s, why, counts, messages)
        if not waiting:
            self.ownership.lost(lease, "lease changed before the record could wait")
            return
        self.doorbell.ring_in(lease.shard, delay_s)

    async def park(
        self,
        lease: Lease,
        taken: Taken,
        row: Callable[..., Awaitable[int]],
        why: tuple[Any, ...],
        hold: bool,
    ) -> None:
        """Make the review row of a message that is no event this worker can read
        (``row(shard, raw, *why, fence)``) and acknowledge it; with ``hold`` (a message
        of another wire version) its record is held behind the row, so that the record's
        later events wait for it, in order."""
        try:
            row_id = await row(lease.shard, taken.raw, *why, Fence(lease.shard, lease.token))
        except StaleFence as exc:
            self.ownership.lost(lease, str(exc))
            return
        acks = [Ack(taken.raw, "dead_lettered")]
        await self.acknowledge(lease, taken, acks, row_id if hold else None, False)

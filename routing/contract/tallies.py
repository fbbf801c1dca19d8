"""Counters kept in a process and added to the deployment's Redis hashes together.

The counters a receiver and a worker keep for ``keylane status`` and ``/metrics``
(accepted, applied, conflicts, the latency histogram, each shard's drain count) are
monotonic tallies that nothing decides on: no accept, take or acknowledgement reads them.
Adding each event's share in its own script step cost a trickle six to eight Redis
commands per event; a :class:`Tally` sums them in the process instead, and its owner
writes what it holds every ``counts_flush_ms`` (and when it stops) as one pipeline of
``HINCRBY`` (``HINCRBYFLOAT`` for a float), one command per hash field that moved, however
many events moved it. The receiver's gateway (asyncio) and the
worker's Redis broker (threads) each own one and flush it through their own client.

What this trades: a reader sees a counter up to one flush interval late, and a process
killed with ``kill -9`` (or whose Redis is away for longer than it keeps retrying) loses
the counts of at most its last interval, never an event, a dedupe mark, a told outcome or
anything the lanes or the accept decide by (depths, backlogs and holds stay in their
scripts). A flush that fails puts its counts back for the next one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Increment:
    """What one flush adds to one field of one hash."""

    key: str
    field: str
    amount: int | float


class Tally:
    """Sums of increments to Redis hash fields, kept until taken (thread-safe: a worker's
    lanes finish in several threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[tuple[str, str], int | float] = {}

    def add(self, key: str, field: str, amount: int | float = 1) -> None:
        """Add ``amount`` to ``field`` of hash ``key`` (at the next flush)."""
        with self._lock:
            self._add(key, field, amount)

    def add_all(self, increments: Iterable[Increment]) -> None:
        """Add each of ``increments`` (one lock for all)."""
        with self._lock:
            for inc in increments:
                self._add(inc.key, inc.field, inc.amount)

    def take(self) -> list[Increment]:
        """Everything summed so far, which this tally forgets: write it, or :meth:`add_all`
        it back when the write fails."""
        with self._lock:
            sums, self._sums = self._sums, {}
        return [Increment(key, field, amount) for (key, field), amount in sums.items() if amount]

    @contextmanager
    def taken(self) -> Iterator[list[Increment]]:
        """What :meth:`take` takes, for the block that writes it: added back when the
        block raises (a failed flush keeps its counts for the next)."""
        increments = self.take()
        try:
            yield increments
        except BaseException:
            self.add_all(increments)
            raise

    def __bool__(self) -> bool:
        return bool(self._sums)

    def _add(self, key: str, field: str, amount: int | float) -> None:
        at = (key, field)
        self._sums[at] = self._sums.get(at, 0) + amount

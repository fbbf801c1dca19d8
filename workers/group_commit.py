"""Group commit: the writes of a process's lanes, gathered into shared store transactions.

A store transaction costs about one disk flush, whatever it holds (SQLite with
``synchronous = FULL``, PostgreSQL with ``synchronous_commit``), so a worker whose lanes
each committed alone would be held to one event per flush. Here a lane hands its commit
(:class:`~keylane.workers.store.Commit`: one event's write, or a record's batch) to
:class:`GroupCommit` and waits; while one transaction runs, the commits that arrive wait
together for the next one. Each commit stays all or nothing on its own (a savepoint each,
see :meth:`Store.commit_group`): one lane's conflict or stale fence never touches
another's write, and a lane's answer is exactly what committing alone would have given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from .blocking import BlockingPool
from .store import Commit, CommitRefused, EventWrite, Fence, Store

#: Commits in one transaction at most (a bound on how long its locks are held).
GROUP_MAX = 64


class GroupCommit:
    """Commits of one process's lanes, one transaction at a time. Loop-side only."""

    def __init__(self, io: BlockingPool, group_max: int = GROUP_MAX) -> None:
        self.io = io
        self.group_max = group_max
        self._waiting: list[tuple[Commit, asyncio.Future[int | CommitRefused]]] = []
        self._running = False
        self._task: asyncio.Task[None] | None = None

    async def commit(self, writes: Sequence[EventWrite], fence: Fence | None) -> int:
        """:meth:`Store.commit_events`, in the next group: the new revision, or its error."""
        future: asyncio.Future[int | CommitRefused] = asyncio.get_running_loop().create_future()
        self._waiting.append((Commit(tuple(writes), fence), future))
        if not self._running:
            self._running = True
            self._task = asyncio.create_task(self._drain())
        result = await future
        if isinstance(result, Exception):
            raise result
        return result

    async def _drain(self) -> None:
        try:
            while self._waiting:
                group = self._waiting[: self.group_max]
                del self._waiting[: self.group_max]
                try:
                    results = await self.io.store(_commit_group, [c for c, _ in group])
                except Exception as exc:  # the transaction as a whole: every lane sees it
                    for _, future in group:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(group, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._running = False


def _commit_group(store: Store, commits: list[Commit]) -> list[int | CommitRefused]:
    return store.commit_group(commits)

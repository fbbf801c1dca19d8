"""The receiver's counts (accepted, duplicates, refusals), kept in a
:class:`~keylane.routing.contract.tallies.Tally` and written to the deployment's counters in
one pipeline ``counts_flush_s`` after the first that is not written yet, and when the
gateway closes, not one ``HINCRBY`` per accept (see :mod:`keylane.routing.contract.tallies`)."""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

from ...routing.contract.tallies import Tally
from .redis_calls import broker_errors

log = logging.getLogger("keylane.receiver")


class CountFlush:
    """A tally of counts and the task that writes it (asyncio)."""

    def __init__(self, client: aioredis.Redis, flush_s: float) -> None:
        self.client = client
        self.flush_s = flush_s
        self.tally = Tally()
        self._flusher: asyncio.Task[None] | None = None

    def add(self, key: str, field: str, amount: int = 1) -> None:
        """Count ``amount`` into ``field`` of hash ``key``, written within ``flush_s``."""
        self.tally.add(key, field, amount)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_after_wait())

    async def flush(self) -> None:
        """Write what the tally holds now, in one pipeline; on a Redis error it is kept
        for the next flush."""
        with self.tally.taken() as increments:
            if not increments:
                return
            pipe = self.client.pipeline(transaction=False)
            for inc in increments:  # one command per hash field that moved
                if isinstance(inc.amount, float):
                    pipe.hincrbyfloat(inc.key, inc.field, inc.amount)
                else:
                    pipe.hincrby(inc.key, inc.field, inc.amount)
            with broker_errors():
                await pipe.execute()

    async def close(self) -> None:
        """Stop the waiting flush and write what is left (lost, and said, if Redis is
        away: counts, never an event)."""
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        try:
            await self.flush()
        except Exception as exc:
            log.warning("counts not written at close: %s", exc)

    async def _flush_after_wait(self) -> None:
        while self.tally:  # a failed flush kept its counts: again after another wait
            await asyncio.sleep(self.flush_s)
            try:
                await self.flush()
            except Exception as exc:
                log.debug("counts not flushed: %s", exc)

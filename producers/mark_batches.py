"""The dedupe marks of a two-step accept, many requests' in one round trip.

A receiver on RabbitMQ reads an event's dedupe mark before the publish and writes it
after the confirm (:mod:`keylane.producers.amqp`): two small Redis calls a request. Each
through redis-py's whole call path (a pooled connection taken and given back, a timeout
armed, the command packed and its reply parsed) cost the receiver more CPU than the
publish itself: 38% of its busy time under load against 15%, profiled.

:class:`MarkBatches` gathers what every request asked for in the meantime into one
**round**: the keys read and the marks written, which the gateway sends as one pipeline
of at most two commands (:meth:`keylane.producers.gateway.ReceiverGateway.marks_round`:
one ``MGET``, one call of ``mark_seen.lua`` with the counts summed). One round is in
flight at a time; what arrives while it is out goes in the next, so rounds grow with the
load, and an idle receiver sends a request's call at once, with no timer. Each request
gets its own values; a failed command fails the requests it carried, a failed round every
request of it (each raises what the gateway raised). This module only gathers and hands
out: the gateway is the one that talks to Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The most requests of each kind in one round (the rest go in the next).
MAX_REQUESTS = 256


@dataclass(frozen=True)
class Mark:
    """One dedupe mark to write: ``key`` set to ``value`` for ``ttl_ms`` unless it exists,
    and ``counts`` added to the deployment's counters."""

    key: str
    value: bytes
    ttl_ms: int
    counts: Mapping[str, int]


#: Sends one round: the keys to read and the marks to write, in one round trip. Returns
#: the values read (one per key, or the exception that failed the read) and what the
#: marks' write answered (or the exception that failed it).
Round = Callable[[list[str], list[Mark]], Awaitable[tuple[Any, Any]]]


@dataclass
class _Read:
    keys: Sequence[str]
    values: asyncio.Future[list[Any]]


@dataclass
class _Write:
    mark: Mark
    done: asyncio.Future[None]


@dataclass
class _Next:
    reads: list[_Read] = field(default_factory=list)
    writes: list[_Write] = field(default_factory=list)


class MarkBatches:
    """Reads of keys and writes of dedupe marks from many requests, sent together by
    ``send_round`` (see the module docstring)."""

    def __init__(self, send_round: Round) -> None:
        self._send_round = send_round
        self._next = _Next()
        self._sender: asyncio.Task[None] | None = None

    async def read(self, *keys: str) -> list[Any]:
        """The values of ``keys`` (None where absent), read with other requests' keys."""
        values: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._next.reads.append(_Read(keys, values))
        self._wake()
        return await values

    async def mark(self, mark: Mark) -> None:
        """Write ``mark``, with other requests' marks."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._next.writes.append(_Write(mark, done))
        self._wake()
        await done

    def _wake(self) -> None:
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send())

    async def _send(self) -> None:
        while self._next.reads or self._next.writes:
            now, rest = self._next, _Next()
            rest.reads, now.reads = now.reads[MAX_REQUESTS:], now.reads[:MAX_REQUESTS]
            rest.writes, now.writes = now.writes[MAX_REQUESTS:], now.writes[:MAX_REQUESTS]
            self._next = rest
            now.reads = [r for r in now.reads if not r.values.done()]  # gave up meanwhile
            now.writes = [w for w in now.writes if not w.done.done()]
            if not now.reads and not now.writes:
                continue
            try:
                await self._round(now)
            except BaseException as exc:  # every request of the round learns it failed
                for future in [r.values for r in now.reads] + [w.done for w in now.writes]:
                    _fail(future, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise

    async def _round(self, now: _Next) -> None:
        keys = [key for read in now.reads for key in read.keys]
        values, written = await self._send_round(keys, [w.mark for w in now.writes])
        at = 0
        for read in now.reads:
            end = at + len(read.keys)
            _settle(read.values, values if isinstance(values, Exception) else values[at:end])
            at = end
        for write in now.writes:
            _settle(write.done, written if isinstance(written, Exception) else None)

    async def close(self) -> None:
        """Stop sending; what still waits is cancelled."""
        sender, self._sender = self._sender, None
        if sender is not None and not sender.done():
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        for future in [r.values for r in self._next.reads] + [w.done for w in self._next.writes]:
            future.cancel()
        self._next = _Next()


def _settle(future: asyncio.Future[Any], value: Any) -> None:
    """Give ``future`` its value, or the error it stands for (unless its request gave up)."""
    if future.done():
        return
    if isinstance(value, Exception):
        future.set_exception(value)
    else:
        future.set_result(value)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if future.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(exc)

"""The dedupe marks of a two-step accept, many requests' in one round trip.

A receiver on RabbitMQ reads an event's dedupe mark before the publish and writes it
after the confirm (:mod:`keylane.producers.amqp`): two small Redis calls a request. Each
through redis-py's whole call path (a pooled connection taken and given back, a timeout
armed, the command packed and its reply parsed) cost the receiver more CPU than the
publish itself: 38% of its busy time under load against 15%, profiled.

:class:`MarkBatches` sends what every request asked for in the meantime as one pipeline of
at most two commands: one ``MGET`` of all the keys read, one call of ``mark_seen.lua``
with all the marks and the counts summed. One pipeline is in flight at a time; what
arrives while it is out goes in the next, so batches grow with the load, and an idle
receiver sends a request's call at once, with no timer. Each request gets its own values;
a failed command fails the requests it carried, a lost connection every request of that
pipeline (each raises what redis-py raised: a ``RedisError``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

#: The most requests of each kind in one pipeline (the rest go in the next).
MAX_REQUESTS = 256


@dataclass
class _Read:
    keys: Sequence[str]
    values: asyncio.Future[list[Any]]


@dataclass
class _Mark:
    key: str
    value: bytes
    ttl_ms: int
    counts: Mapping[str, int]
    done: asyncio.Future[None]


@dataclass
class _Round:
    reads: list[_Read] = field(default_factory=list)
    marks: list[_Mark] = field(default_factory=list)


class MarkBatches:
    """Reads of keys and writes of dedupe marks from many requests, sent together (see the
    module docstring). ``script`` is ``mark_seen.lua``; ``counters`` the hash it counts in."""

    def __init__(self, client: aioredis.Redis, script: AsyncScript, counters: str) -> None:
        self._client = client
        self._script = script
        self._counters = counters
        self._next = _Round()
        self._sender: asyncio.Task[None] | None = None

    async def read(self, *keys: str) -> list[Any]:
        """The values of ``keys`` (None where absent), read with other requests' keys."""
        values: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._next.reads.append(_Read(keys, values))
        self._wake()
        return await values

    async def mark(self, key: str, value: bytes, ttl_ms: int, counts: Mapping[str, int]) -> None:
        """Set ``key`` to ``value`` for ``ttl_ms`` unless it exists, and add ``counts`` to
        the counters, with other requests' marks."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._next.marks.append(_Mark(key, value, ttl_ms, counts, done))
        self._wake()
        await done

    def _wake(self) -> None:
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send())

    async def _send(self) -> None:
        while self._next.reads or self._next.marks:
            now, rest = self._next, _Round()
            rest.reads, now.reads = now.reads[MAX_REQUESTS:], now.reads[:MAX_REQUESTS]
            rest.marks, now.marks = now.marks[MAX_REQUESTS:], now.marks[:MAX_REQUESTS]
            self._next = rest
            now.reads = [r for r in now.reads if not r.values.done()]  # gave up meanwhile
            now.marks = [m for m in now.marks if not m.done.done()]
            try:
                await self._send_round(now)
            except BaseException as exc:  # every request of the round learns it failed
                for future in [r.values for r in now.reads] + [m.done for m in now.marks]:
                    _fail(future, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise

    async def _send_round(self, now: _Round) -> None:
        pipe = self._client.pipeline(transaction=False)
        if now.reads:
            pipe.mget([key for read in now.reads for key in read.keys])
        if now.marks:
            pipe.evalsha(self._script.sha, *self._mark_call(now.marks))
        if not pipe.command_stack:
            return
        replies = await pipe.execute(raise_on_error=False)
        if now.reads:
            values = replies.pop(0)
            at = 0
            for read in now.reads:
                end = at + len(read.keys)
                _settle(read.values, values if isinstance(values, Exception) else values[at:end])
                at = end
        if now.marks:
            reply = replies.pop(0)
            if isinstance(reply, NoScriptError):  # a restarted or flushed Redis
                await self._client.script_load(self._script.script)
                reply = await self._client.evalsha(self._script.sha, *self._mark_call(now.marks))
            for mark in now.marks:
                _settle(mark.done, reply if isinstance(reply, Exception) else None)

    def _mark_call(self, marks: list[_Mark]) -> list[Any]:
        counts: Counter[str] = Counter()
        for mark in marks:
            counts.update(mark.counts)
        keys = [self._counters, *(mark.key for mark in marks)]
        args: list[Any] = [len(counts)]
        for name, amount in counts.items():
            args += [name, amount]
        for mark in marks:
            args += [mark.value, mark.ttl_ms]
        return [len(keys), *keys, *args]

    async def close(self) -> None:
        """Stop sending; what still waits is cancelled (the client is closed by its owner)."""
        sender, self._sender = self._sender, None
        if sender is not None and not sender.done():
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        for future in [r.values for r in self._next.reads] + [m.done for m in self._next.marks]:
            future.cancel()
        self._next = _Round()


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

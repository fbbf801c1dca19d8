"""Rounds: what many requests of one receiver ask of Redis at once, sent as one call.

A request that needs Redis (its accept script, its dedupe marks) puts what it asks in the
next **round** and waits for its own answer. One round is in flight at a time; what
arrives while it is out goes in the next, so rounds grow with the load, and an idle
receiver sends a request's call at once, with no timer. Each request gets its own answer;
a call's error fails the requests it carried (each raises it), never those of another
round. A request that gave up before its round was sent (its sender left) is not sent.
This module only gathers and hands out: whoever sends a round is the one that talks to
Redis (the gateway).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

#: The most requests in one round (the rest go in the next).
MAX_REQUESTS = 256

Ask = TypeVar("Ask")
Answer = TypeVar("Answer")

#: Sends one round: each request's answer, or the exception that failed it, in order.
Send = Callable[[list[Ask]], Awaitable[Sequence[Answer | BaseException]]]


class Rounds(Generic[Ask, Answer]):
    """Requests sent together by ``send`` (see the module docstring)."""

    def __init__(self, send: Send[Ask, Answer], most: int = MAX_REQUESTS) -> None:
        self._send_round = send
        self._most = most
        self._next: list[tuple[Ask, asyncio.Future[Answer]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def ask(self, request: Ask) -> Answer:
        """``request``'s answer, from the round it went in."""
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._next.append((request, answer))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send())
        return await answer

    async def _send(self) -> None:
        while self._next:
            now, self._next = self._next[: self._most], self._next[self._most :]
            now = [(request, answer) for request, answer in now if not answer.done()]
            if not now:
                continue
            try:
                answers = await self._send_round([request for request, _ in now])
            except BaseException as exc:  # every request of the round learns it failed
                for _, answer in now:
                    _settle(answer, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for (_, answer), value in zip(now, answers, strict=True):
                _settle(answer, value)

    async def close(self) -> None:
        """Stop sending; what still waits is cancelled."""
        sender, self._sender = self._sender, None
        if sender is not None and not sender.done():
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        for _, answer in self._next:
            answer.cancel()
        self._next = []


def _settle(future: asyncio.Future[Answer], value: Answer | BaseException) -> None:
    """Give ``future`` its answer, or the error it stands for (unless its request gave up)."""
    if future.done():
        return
    if isinstance(value, asyncio.CancelledError):
        future.cancel()
    elif isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)

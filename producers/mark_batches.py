"""The dedupe marks of a two-step accept, many requests' in one round trip.

A receiver on RabbitMQ reads an event's dedupe mark before the publish and writes it
after the confirm (:mod:`keylane.producers.amqp`): two small Redis calls a request. Each
through redis-py's whole call path (a pooled connection taken and given back, a timeout
armed, the command packed and its reply parsed) cost the receiver more CPU than the
publish itself: 38% of its busy time under load against 15%, profiled.

:class:`MarkBatches` puts what every request asked for in the meantime into one
**round** (:mod:`keylane.producers.rounds`): the keys read and the marks written, which
the gateway sends as one pipeline of at most two commands
(:meth:`keylane.producers.gateway.ReceiverGateway.marks_round`: one ``MGET``, one call of
``mark_seen.lua`` with the counts summed). Each request gets its own values; a failed
command fails the requests it carried, a failed round every request of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .rounds import MAX_REQUESTS, Rounds

__all__ = ["MAX_REQUESTS", "Mark", "MarkBatches", "Round"]


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

#: What one request asks: the keys it reads, or the mark it writes.
_Ask = Sequence[str] | Mark


class MarkBatches:
    """Reads of keys and writes of dedupe marks from many requests, sent together by
    ``send_round`` (see the module docstring)."""

    def __init__(self, send_round: Round) -> None:
        self._send_round = send_round
        self._rounds: Rounds[_Ask, Any] = Rounds(self._round)

    async def read(self, *keys: str) -> list[Any]:
        """The values of ``keys`` (None where absent), read with other requests' keys."""
        values: list[Any] = await self._rounds.ask(keys)
        return values

    async def mark(self, mark: Mark) -> None:
        """Write ``mark``, with other requests' marks."""
        await self._rounds.ask(mark)

    async def _round(self, asks: list[_Ask]) -> list[Any]:
        reads = [ask for ask in asks if not isinstance(ask, Mark)]
        marks = [ask for ask in asks if isinstance(ask, Mark)]
        values, written = await self._send_round([key for keys in reads for key in keys], marks)
        answers: list[Any] = []
        at = 0
        for ask in asks:
            if isinstance(ask, Mark):
                answers.append(written if isinstance(written, Exception) else None)
                continue
            end = at + len(ask)
            answers.append(values if isinstance(values, Exception) else values[at:end])
            at = end
        return answers

    async def close(self) -> None:
        """Stop sending; what still waits is cancelled."""
        await self._rounds.close()

"""A message's tries on RabbitMQ, counted so that only tries count.

The broker's ``x-delivery-count`` counts every time a delivery went back to its queue:
a lane's try that killed its worker, but also each delivery a lost connection took back
that no lane had started (a worker holds up to ``amqp_prefetch`` of them). Counted as
tries, a few connection losses in a row would make an event no lane ever tried a
``poison`` dead letter. So before a lane starts a message the broker handed out before,
the try is noted in the store (:class:`~keylane.workers.store.TryNotes`), committed
before the try begins, and the message's tries before this delivery are taken as

    min(x-delivery-count, 1 + the tries noted before this one)

(the ``1``: its first delivery, never noted, may have been tried). A message's first
delivery costs nothing; a redelivered one, one store write per delivery, the first time a
lane takes it (a crash counts one try per delivery: the tries of one delivery in this
worker's memory are counted there, as before). Should the store not answer, the
broker's count stands, as before: more tries, never fewer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from ....routing.redis_keys import message_digest
from ...store import TryNotes
from .consumers import Delivery

log = logging.getLogger("keylane.rabbitmq")

T = TypeVar("T")
Stored = Callable[[Callable[[TryNotes], T]], T]


def note_try(stored: Stored[int], shard: int, delivery: Delivery) -> None:
    """(The delivery's record busy, before its try.) Note the try of a redelivered
    ``delivery`` once, and bring its count down to the tries noted."""
    if not delivery.returned or delivery.noted:
        return
    digest = message_digest(delivery.raw)
    try:
        noted = stored(lambda store: store.note_try(shard, digest))
    except Exception as exc:
        log.warning("shard %s: could not note a try (the broker's count stands): %s", shard, exc)
        return
    delivery.noted = True
    delivery.returned = min(delivery.returned, noted)


def settle(stored: Stored[dict[str, int]], shard: int, deliveries: Sequence[Delivery]) -> None:
    """(The record busy, before its deliveries are parked with their counts.) Bring the
    counts of redelivered ``deliveries`` no lane took here down to the tries noted."""
    unsure = {message_digest(d.raw): d for d in deliveries if d.returned and not d.noted}
    if not unsure:
        return
    try:
        noted = stored(lambda store: store.noted_tries(shard, list(unsure)))
    except Exception as exc:
        log.warning("shard %s: could not read tries (the broker's count stands): %s", shard, exc)
        return
    for digest, delivery in unsure.items():
        delivery.returned = min(delivery.returned, 1 + noted.get(digest, 0))


def forget(stored: Stored[None], shard: int, deliveries: Sequence[Delivery]) -> None:
    """``deliveries`` are acknowledged or parked: the notes of those that had one leave
    (a note left behind by a failure here leaves with age)."""
    _forget(stored, shard, [message_digest(d.raw) for d in deliveries if d.noted])


def forget_dead(stored: Stored[None], shard: int, raw: bytes) -> None:
    """A message the broker dead-lettered past its own limit is a review row now: its
    note, if a lane made one, leaves (the consumer of dead letters holds no delivery that
    says whether one was made, so it always asks)."""
    _forget(stored, shard, [message_digest(raw)])


def _forget(stored: Stored[None], shard: int, digests: list[str]) -> None:
    if not digests:
        return
    try:
        stored(lambda store: store.forget_tries(shard, digests))
    except Exception as exc:
        log.warning("shard %s: could not forget %d try note(s): %s", shard, len(digests), exc)

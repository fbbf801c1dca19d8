"""RabbitMQ names of a deployment (the receiver publishes to them, the lane broker declares
and consumes them): every queue and exchange under the namespace, as every Redis key is
(:mod:`keylane.routing.redis_keys`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import ShardMap
from .settings import Settings


def shard_queue(namespace: str, shards: ShardMap, shard: int) -> str:
    """The shard's quorum queue: the Celery queue name under the namespace."""
    return f"{namespace}:{shards.queue_name(shard)}"


def dead_queue(namespace: str) -> str:
    """Where the broker dead-letters a message past its delivery limit (also the name of
    the direct exchange that routes there)."""
    return f"{namespace}:dead"


def probe_queue(namespace: str) -> str:
    """Where a receiver's readiness probe publishes (a quorum queue that keeps one
    message): a confirm from it says a quorum can take a publish now."""
    return f"{namespace}:probe"


def members_exchange(namespace: str) -> str:
    """The fanout exchange the workers' membership beats go through."""
    return f"{namespace}:members"


#: The queue argument that places a new quorum queue's leader.
LEADER_LOCATOR = "x-queue-leader-locator"


def shard_queue_arguments(settings: Settings) -> dict[str, Any]:
    """The shard queues' arguments (a queue's arguments are fixed at declaration)."""
    return {
        "x-queue-type": "quorum",
        "x-single-active-consumer": True,
        "x-delivery-limit": settings.max_deliveries + settings.amqp_delivery_margin,
        "x-dead-letter-exchange": dead_queue(settings.namespace),
        "x-dead-letter-routing-key": dead_queue(settings.namespace),
        # At-least-once dead-lettering works only with reject-publish; without it the
        # queue falls back to at-most-once, silently (ops/docs/rabbitmq.md).
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        # The shard's high-water mark: past it a publish is refused (nacked), and the
        # receiver answers 503 with Retry-After.
        "x-max-length": settings.shard_high_water,
        # Each new queue's leader on the node that leads the fewest (the default puts it
        # on the declaring connection's node: one node led all 64 shards).
        LEADER_LOCATOR: "balanced",
    }


def as_declared_before(arguments: dict[str, Any]) -> dict[str, Any]:
    """A queue's arguments as a deployment from before balanced leaders declared it (no
    leader locator): a queue keeps the arguments it was created with, and a declare with
    others is refused, so such a queue is declared again with these."""
    return {name: value for name, value in arguments.items() if name != LEADER_LOCATOR}


@dataclass(frozen=True)
class Topology:
    """What a deployment declares on RabbitMQ: exchanges (name, type), queues (name,
    arguments), bindings (queue, exchange; the routing key is the queue's name). Both
    sides declare all of it, durable and never auto-deleted, before they use it (the same
    on both: a queue declared twice with other arguments is refused); a queue whose
    declare is refused is declared again with :func:`as_declared_before` its arguments."""

    exchanges: list[tuple[str, str]]
    queues: list[tuple[str, dict[str, Any]]]
    bindings: list[tuple[str, str]]


def topology(settings: Settings) -> Topology:
    """The dead-letter exchange and queue, the readiness probe's queue and every shard
    queue. Receivers declare it too before they publish: they need not wait for a
    worker (a message to a queue not declared yet is returned, never enqueued)."""
    dead = dead_queue(settings.namespace)
    dead_arguments: dict[str, Any] = {"x-queue-type": "quorum", "x-single-active-consumer": True}
    shard_arguments = shard_queue_arguments(settings)
    shards = [
        (shard_queue(settings.namespace, settings.shards, shard), shard_arguments)
        for shard in range(settings.shard_count)
    ]
    probe_arguments: dict[str, Any] = {"x-queue-type": "quorum", "x-max-length": 1}
    queues = [(dead, dead_arguments), (probe_queue(settings.namespace), probe_arguments), *shards]
    return Topology([(dead, "direct")], queues, [(dead, dead)])

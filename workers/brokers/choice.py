"""The worker side's broker choice: the one module of this side that asks which broker the
deployment runs on (``KEYLANE_BROKER_URL``: Redis unless it is ``amqp://``).

* :func:`open_lane_broker` — the lane broker (Redis or RabbitMQ, each every role of
  :mod:`keylane.workers.broker`) whose roles the lanes and the ownership talk to, and the
  Redis beside it when there is one (destinations' flow control, the SQLite store's
  one-writer claim; on RabbitMQ an optional helper);
* :func:`celery_transport` — where Celery's own consumer, heartbeats, remote control and
  task events go;
* :func:`shard_queue_name` — a shard queue's name as Celery's tools (Flower) know it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kombu.entity import Queue

from ...routing.contract.amqp_names import shard_queue
from ...routing.contract.settings import Settings
from ..stores.sql import SqlStore
from .rabbitmq import RabbitLaneBroker
from .redis import RedisLaneBroker

#: The one queue Celery's own consumer listens on; keylane publishes nothing to it.
CONTROL_QUEUE = "keylane.control"


def open_lane_broker(
    settings: Settings,
    open_store: Callable[[], SqlStore],
    past_delivery_limit: Callable[[bytes, dict[str, object]], None],
) -> tuple[RedisLaneBroker | RabbitLaneBroker, RedisLaneBroker | None]:
    """The lane broker, and the Redis beside it (None on RabbitMQ without
    ``KEYLANE_REDIS_URL``). The caller owns the broker (closes it) and hands each part
    the role it uses. On RabbitMQ, ``open_store`` gives the consumers their store
    connections (held records are parked there) and ``past_delivery_limit`` is called
    with a message the broker would otherwise drop."""
    if not settings.broker_is_rabbitmq:
        redis = RedisLaneBroker.from_settings(settings)
        return redis, redis
    helper = RedisLaneBroker.from_settings(settings) if settings.redis_url is not None else None
    after_ack = helper.after_ack if helper is not None else None
    return RabbitLaneBroker(settings, open_store, past_delivery_limit, after_ack), helper


def writer_claim_broker(settings: Settings) -> RedisLaneBroker | None:
    """Where a SQLite store's one writer is claimed (Redis); None when there is no claim
    to make (PostgreSQL, or RabbitMQ, which needs PostgreSQL)."""
    if settings.store_is_sqlite and not settings.broker_is_rabbitmq:
        return RedisLaneBroker.from_settings(settings)
    return None


@dataclass(frozen=True)
class CeleryTransport:
    """Celery's broker: its URL, kombu's transport options and its control queue."""

    url: str
    options: dict[str, Any]
    control_queue: Queue


def celery_transport(settings: Settings) -> CeleryTransport:
    """On Redis: keylane's namespace as kombu's key prefix, and timeouts. On RabbitMQ: the
    cluster (kombu's failover URL), and the control queue a quorum queue: a classic one
    lives on one node, and that node's loss would stop every worker's Celery consumer
    (Celery then leaves out the global QoS quorum queues do not take)."""
    if settings.broker_is_rabbitmq:
        control = Queue(CONTROL_QUEUE, queue_arguments={"x-queue-type": "quorum"})
        return CeleryTransport(";".join(settings.amqp_urls()), {}, control)
    return CeleryTransport(settings.redis_dsn(), broker_options(settings), Queue(CONTROL_QUEUE))


def broker_options(settings: Settings) -> dict[str, Any]:
    """kombu's transport options on Redis: keylane's namespace as the key prefix, and
    timeouts."""
    return {
        "global_keyprefix": settings.keys.prefix,
        "socket_timeout": 10,
        "socket_connect_timeout": 5,
        "health_check_interval": 15,
    }


def shard_queue_name(settings: Settings, shard: int) -> str:
    """``shard``'s queue as Celery's tools name it: on RabbitMQ the quorum queue's own name,
    under the namespace; on Redis the Celery queue's (kombu adds the namespace as its key
    prefix)."""
    if settings.broker_is_rabbitmq:
        return shard_queue(settings.namespace, settings.shards, shard)
    return settings.shards.queue_name(shard)

"""The Celery application of a keylane deployment.

Celery carries the shard queues (ordinary Celery queues of ``keylane.apply`` task
messages), the workers' heartbeats and remote control, and the events Flower shows.
The lanes, not Celery's consumer, take messages from the shard queues; see
:mod:`workers.lanebroker` for why.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu.entity import Queue

from routing.router import APPLY_TASK, RELEASE_TASK, ShardRouter
from workers.errors import NotOwner
from workers.settings import Settings

#: The one queue Celery's own consumer listens on; keylane publishes nothing to it.
CONTROL_QUEUE = "keylane.control"


def broker_options(settings: Settings) -> dict[str, Any]:
    """kombu transport options: keylane's namespace as the key prefix, and timeouts."""
    return {
        "global_keyprefix": settings.keys.prefix,
        "socket_timeout": 10,
        "socket_connect_timeout": 5,
        "health_check_interval": 15,
    }


def create_app(settings: Settings) -> Celery:
    """A Celery app configured for ``settings`` (not set as the current app)."""
    app = Celery("keylane", broker=settings.redis_dsn(), set_as_current=False)
    app.conf.update(
        broker_transport_options=broker_options(settings),
        broker_connection_retry_on_startup=True,
        task_default_queue=CONTROL_QUEUE,
        task_queues=[Queue(CONTROL_QUEUE), *(Queue(q) for q in settings.shards.all_queues())],
        task_create_missing_queues=False,
        task_routes=(ShardRouter(settings.shards),),
        task_ignore_result=True,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        enable_utc=True,
    )

    @app.task(name=APPLY_TASK, ignore_result=True, shared=False)
    def apply(event: dict[str, Any]) -> None:
        # Messages of this task are applied by the lanes, under a shard lease. A plain
        # Celery worker that consumes a shard queue by mistake must not apply them.
        raise NotOwner(-1, "keylane.apply runs only inside a keylane lane")

    @app.task(name=RELEASE_TASK, ignore_result=True, shared=False)
    def release(record_key: str, dead_letter_id: int) -> None:
        raise NotOwner(-1, "keylane.release runs only inside a keylane lane")

    return app

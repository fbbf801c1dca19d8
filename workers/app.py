"""The Celery application of a keylane deployment.

Celery carries the shard queues (ordinary Celery queues of ``keylane.apply`` task
messages), the workers' heartbeats and remote control, and the events Flower shows.
The lanes, not Celery's consumer, take messages from the shard queues; see
:mod:`keylane.workers.broker` for why.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from celery.exceptions import Ignore
from kombu.entity import Queue

from ..routing.contract.errors import NotOwner
from ..routing.contract.events import Event
from ..routing.contract.message import build_event_message, build_unhold_message
from ..routing.contract.settings import Settings
from ..routing.router import EVENT_TASK, UNHOLD_TASK, ShardRouter
from .brokers.choice import CONTROL_QUEUE, celery_transport
from .brokers.redis import RedisLaneBroker

log = logging.getLogger("keylane.app")


def create_app(settings: Settings) -> Celery:
    """A Celery app configured for ``settings`` (not set as the current app). On RabbitMQ
    its broker is the cluster (kombu's failover URL), so workers' heartbeats, remote
    control and task events go there; the shard queues are the lanes' own."""
    transport = celery_transport(settings)
    app = Celery("keylane", broker=transport.url, set_as_current=False)
    app.conf.update(
        broker_transport_options=transport.options,
        broker_connection_retry_on_startup=True,
        # A channel error while Celery's consumer (re)starts is retried like a lost
        # connection, not the end of the worker: after a RabbitMQ node's loss, declaring the
        # worker's exclusive remote-control queue again can be refused for a moment
        # (the old one is still on record, locked by the dead connection).
        broker_channel_error_retry=True,
        task_default_queue=CONTROL_QUEUE,
        task_queues=[transport.control_queue, *(Queue(q) for q in settings.shards.all_queues())],
        task_create_missing_queues=False,
        task_routes=(ShardRouter(settings.shards),),
        task_ignore_result=True,
        accept_content=["json"],  # never pickle (and no root warning about it)
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        enable_utc=True,
    )

    # Messages of these tasks are run by the lanes, under a shard lease. A plain Celery
    # consumer of a shard queue (started by hand, or added from Flower) must neither run
    # them nor lose them: the message goes back to the head of its queue for the lane.
    @app.task(name=EVENT_TASK, ignore_result=True, shared=False, bind=True)
    def apply(self: Any, event: dict[str, Any]) -> None:
        _give_back(settings, self.request, build_event_message(Event(**event), _queue(self)))

    @app.task(name=UNHOLD_TASK, ignore_result=True, shared=False, bind=True)
    def unhold(self: Any, record_key: str, dead_letter_id: int) -> None:
        message = build_unhold_message(record_key, dead_letter_id, _queue(self))
        _give_back(settings, self.request, message)

    return app


def _queue(task: Any) -> str:
    return str((task.request.delivery_info or {}).get("routing_key") or "")


def _give_back(settings: Settings, request: Any, message: bytes) -> None:
    """Put a shard message that a plain Celery consumer took back at the head of its queue,
    then let Celery acknowledge the copy it holds (``Ignore``)."""
    queue = str((request.delivery_info or {}).get("routing_key") or "")
    try:
        shard = settings.shards.shard_of_queue(queue)
    except ValueError as exc:
        raise NotOwner(-1, f"keylane tasks run only inside keylane lanes ({exc})") from exc
    broker = RedisLaneBroker.from_settings(settings)
    try:
        broker.give_back(shard, message)
    finally:
        broker.close()
    log.error(
        "a plain Celery consumer took a message from %s; it is back at the head of the "
        "queue for the shard's lane (do not consume keylane's shard queues)",
        queue,
    )
    raise Ignore()

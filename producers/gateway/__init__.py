"""The producers' one gateway to Redis, one module per concept:

* :mod:`.receiver_gateway`: the receiver's accept script, the review message of a reused
  id, the dedupe marks of the RabbitMQ receiver, and the reads behind backpressure and
  ``/metrics``; what an accept hands Redis and what it answers in :mod:`.accept_items`,
  its counts written together by :mod:`.count_flush`;
* :mod:`.door_log`: the deliveries the receiver turned away, a bounded stream per source;
* :mod:`.outcome_feed`: the told outcomes a receiver's waiting requests hear;
* :mod:`.schedule_gateway`: the scheduler's steps, run leases and run log;
* :mod:`.redis_calls`: how each of them runs a Lua script (``scripts/`` beside it) and
  turns a Redis error into :class:`BrokerUnavailable`.

Only the modules of this package import the Redis client on the producer side
(``tests/test_layers.py``).
"""

from .accept_items import BatchResult, Enqueue, EnqueueResult, Verdict
from .door_log import DoorEntry, DoorLog
from .outcome_feed import OutcomeFeed
from .queue_reads import MetricSnapshot, QueueReads, QueueSnapshot
from .receiver_gateway import POOL_CONNECTIONS, POOL_WAIT_S, ReceiverGateway
from .redis_calls import SCRIPTS, LoadedScript, broker_errors, run_script, script_text
from .schedule_gateway import ScheduleGateway, StepReply

__all__ = [
    "POOL_CONNECTIONS",
    "POOL_WAIT_S",
    "SCRIPTS",
    "BatchResult",
    "DoorEntry",
    "DoorLog",
    "Enqueue",
    "EnqueueResult",
    "LoadedScript",
    "MetricSnapshot",
    "OutcomeFeed",
    "QueueReads",
    "QueueSnapshot",
    "ReceiverGateway",
    "ScheduleGateway",
    "StepReply",
    "Verdict",
    "broker_errors",
    "run_script",
    "script_text",
]

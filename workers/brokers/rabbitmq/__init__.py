"""The lanes' broker on RabbitMQ (see :mod:`.broker` for what RabbitMQ gives and what
keylane adds: the failure model). One concept per module:

* :mod:`.broker` — :class:`RabbitLaneBroker`, the lane broker itself (each role of
  :mod:`keylane.workers.broker`): finishing and waiting records, sending messages;
* :mod:`.taking` — handing a shard's next due record to a lane;
* :mod:`.dead_letters` — the messages the broker dead-lettered past its delivery limit;
* :mod:`.link` — the AMQP link: connect, topology, channel calls; the
  only module here that imports the AMQP client;
* :mod:`.amqp_thread` — the connection thread that runs every call needing the broker;
* :mod:`.acks` — acknowledgements gathered per channel, a contiguous run in one frame;
* :mod:`.after_acks` — the outcomes counted and told after their acks, across lanes;
* :mod:`.ownership` — shard consumers, the single active consumer, fencing tokens;
* :mod:`.membership` — live workers and the spread of shards over them;
* :mod:`.parking` — records that wait longer than the broker may hold a delivery;
* :mod:`.holding` — records held behind a dead letter (policy ``hold``) and their release;
* :mod:`.consumers` — what a shard consumer holds; :mod:`.notes` — per-delivery notes;
* :mod:`.survey` — what an operator sees: queue depths and the members' beats.
"""

from .broker import RabbitLaneBroker
from .link import delete_topology
from .survey import QueueDepth, Survey, survey

__all__ = [
    "QueueDepth",
    "RabbitLaneBroker",
    "Survey",
    "delete_topology",
    "survey",
]

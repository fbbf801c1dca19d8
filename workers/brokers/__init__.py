"""The lane brokers: one implementation of the roles of :mod:`keylane.workers.broker`
(:class:`RecordQueue`, :class:`ShardLeases`, :class:`MessageNotes`) per broker, each the
only module that imports its client library.

* :mod:`keylane.workers.brokers.redis` — Redis (the default; ``keylane up`` embeds one):
  every step one Lua script, the scripts beside it in ``redis/*.lua``.
* :mod:`keylane.workers.brokers.rabbitmq` — RabbitMQ (quorum queues with a single active
  consumer): a package, one module per concept, the client imported by its ``link`` only.
"""

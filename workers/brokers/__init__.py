"""The lane brokers: one implementation of :class:`keylane.workers.broker.LaneBroker` per
broker, each the only module that imports its client library.

* :mod:`keylane.workers.brokers.redis` — Redis (the default; ``keylane up`` embeds one):
  every step one Lua script, the scripts beside it in ``redis/*.lua``.
"""

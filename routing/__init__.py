"""Pure routing: record key -> shard -> queue name, and the shard assignment. No I/O.

Its one subpackage, :mod:`keylane.routing.contract`, is what the two sides share (it sits
in the user's ``routing/`` folder, one layer above the routing functions): the wire
message, events, settings, sources, errors, Redis key names and scripts. Pure functions and
models only here, tested with hypothesis: ``hashing.py`` (``stable_hash``), ``shards.py``
(``ShardMap``), ``router.py`` (the Celery router and task names), ``assignment.py``
(balanced shard assignment), ``keys.py`` (every Redis key name).
"""

from .hashing import stable_hash
from .shards import DEFAULT_SHARD_COUNT, QUEUE_PREFIX, ShardMap

__all__ = ["DEFAULT_SHARD_COUNT", "QUEUE_PREFIX", "ShardMap", "stable_hash"]

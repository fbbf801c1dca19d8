"""Routing: record key -> shard -> queue name, and the shard assignment. No I/O.

Pure functions and models, tested with hypothesis: ``hashing.py`` (``stable_hash``),
``shards.py`` (``ShardMap``), ``router.py`` (the Celery router and task names),
``assignment.py`` (balanced shard assignment), ``redis_keys.py`` (every Redis key name).

Its one subpackage, :mod:`keylane.routing.contract` (a layer above these functions), is
what the two sides share, as models and parsing: the wire message, events, settings,
sources, destinations, when scheduled jobs run, errors, the Lua scripts as text. No I/O and
no user code there either: what reads Redis, imports user code or kills a process lives
with the side that does it (``tests/test_layers.py`` checks both packages).
"""

from .hashing import stable_hash
from .shards import DEFAULT_SHARD_COUNT, QUEUE_PREFIX, ShardMap

__all__ = ["DEFAULT_SHARD_COUNT", "QUEUE_PREFIX", "ShardMap", "stable_hash"]

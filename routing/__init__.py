"""Pure routing: record key -> shard -> queue name. No I/O lives here."""

from .hashing import stable_hash
from .shards import DEFAULT_SHARD_COUNT, QUEUE_PREFIX, ShardMap

__all__ = ["DEFAULT_SHARD_COUNT", "QUEUE_PREFIX", "ShardMap", "stable_hash"]

"""The lanes: the apply task, stores, shard ownership, retry and dead-lettering."""

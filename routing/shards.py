"""Shards and their queue names.

The shard count is fixed for the life of a deployment: changing it moves keys to other
shards, and events already queued for a key would then race the ones queued after the
change. Changing it safely means draining every queue first (``keylane status`` shows
depths) and restarting everything with the new count.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from .hashing import stable_hash

DEFAULT_SHARD_COUNT = 64
MAX_SHARD_COUNT = 4096
QUEUE_PREFIX = "keylane.shard."


@dataclass(frozen=True)
class ShardMap:
    """Maps record keys to shards and shards to Celery queue names."""

    count: int = DEFAULT_SHARD_COUNT

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARD_COUNT:
            raise ValueError(
                f"shard count must be between 1 and {MAX_SHARD_COUNT}, got {self.count}"
            )

    @property
    def width(self) -> int:
        """Digits in a shard number, so queue names sort in shard order."""
        return max(2, len(str(self.count - 1)))

    def shard_for_key(self, record_key: str) -> int:
        """The shard that owns ``record_key``."""
        return stable_hash(record_key) % self.count

    def queue_name(self, shard: int) -> str:
        """The Celery queue of ``shard``, e.g. ``keylane.shard.07``."""
        self.check(shard)
        return f"{QUEUE_PREFIX}{shard:0{self.width}d}"

    def queue_for_key(self, record_key: str) -> str:
        """The Celery queue that carries events about ``record_key``."""
        return self.queue_name(self.shard_for_key(record_key))

    def shard_of_queue(self, queue: str) -> int:
        """Inverse of :meth:`queue_name`; raises ``ValueError`` for a foreign name."""
        digits = queue[len(QUEUE_PREFIX) :] if queue.startswith(QUEUE_PREFIX) else ""
        if not (digits.isascii() and digits.isdigit()):
            raise ValueError(f"not a keylane shard queue: {queue!r}")
        shard = int(digits)
        self.check(shard)
        if queue != self.queue_name(shard):  # e.g. keylane.shard.7 for keylane.shard.07
            raise ValueError(f"not a queue name of this shard map: {queue!r}")
        return shard

    def all_queues(self) -> list[str]:
        """Every shard queue, in shard order."""
        return [self.queue_name(shard) for shard in range(self.count)]

    def check(self, shard: int) -> None:
        """Raise ``ValueError`` unless ``shard`` is a shard of this map."""
        if not 0 <= shard < self.count:
            raise ValueError(f"shard {shard} out of range 0..{self.count - 1}")


def shard_ranges(shards: Iterable[int]) -> str:
    """Shard numbers as short text for a log line or a summary: ``0-5, 9, 12-63``."""
    ordered = sorted(set(shards))
    runs: list[list[int]] = []
    for shard in ordered:
        if runs and shard == runs[-1][1] + 1:
            runs[-1][1] = shard
        else:
            runs.append([shard, shard])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)

"""The notes the Redis lane broker keeps with an in-flight message
(:class:`MessageNotes`): its last failure, a write in doubt, its retries; kept in its
shard's deliveries hash under the message's digest, forgotten by its ack."""

from __future__ import annotations

from typing import Any

from ...routing.contract.destinations import EXCERPT_CHARS
from ...routing.contract.replies import reply_int, reply_text
from ...routing.redis_keys import MESSAGE_NOTES, message_digest
from ..broker import MessageNotes
from .redis_calls import RedisScripts, call


class RedisMessageNotes(RedisScripts, MessageNotes):
    """Notes kept with a message while it is in flight."""

    def note_failure(self, shard: int, raw: bytes, error: str) -> None:
        self._note(shard, raw, "error", error[:EXCERPT_CHARS])

    def last_failure(self, shard: int, raw: bytes) -> str:
        return reply_text(self._noted(shard, raw, "error"))

    def note_write(self, shard: int, raw: bytes, condition: str | None) -> None:
        self._note(shard, raw, "write", condition)

    def noted_write(self, shard: int, raw: bytes) -> str | None:
        value = self._noted(shard, raw, "write")
        return None if value is None else reply_text(value)

    def retries(self, shard: int, raw: bytes) -> int:
        return reply_int(self._noted(shard, raw, "retries"))

    def note_retry(self, shard: int, raw: bytes) -> tuple[int, float]:
        retries, since_ms = self._run(
            "note_retry", [self.keys.deliveries(shard)], [message_digest(raw)]
        )
        return int(retries), int(since_ms) / 1000

    def _note(self, shard: int, raw: bytes, what: str, value: str | None) -> None:
        """Keep ``value`` (None: forget it) with the message, in its shard's deliveries
        hash; the message's ack forgets it."""
        assert what in MESSAGE_NOTES
        key, field = self.keys.deliveries(shard), f"{message_digest(raw)}:{what}"
        if value is None:
            call(lambda: self.client.hdel(key, field))
        else:
            call(lambda: self.client.hset(key, field, value))

    def _noted(self, shard: int, raw: bytes, what: str) -> Any:
        field = f"{message_digest(raw)}:{what}"
        return call(lambda: self.client.hget(self.keys.deliveries(shard), field))

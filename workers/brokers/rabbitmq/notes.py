"""Notes kept with an in-flight message (a failure, a write condition, retries): in
memory, on the delivery, so they go with it when the broker takes it back."""

from __future__ import annotations

import threading
import time
from typing import Any

from .consumers import Delivery, ShardConsumer


class DeliveryNotes:
    """The per-delivery notes of :class:`RabbitLaneBroker`."""

    _lock: threading.RLock
    _shards: dict[int, ShardConsumer]

    def _delivery(self, shard: int, raw: bytes) -> Delivery | None:
        consumer = self._shards.get(shard)
        if consumer is None:
            return None
        return next((d for d in consumer.deliveries.values() if d.raw == raw), None)

    def _note(self, shard: int, raw: bytes, what: str, value: Any) -> None:
        with self._lock:
            delivery = self._delivery(shard, raw)
            if delivery is None:
                return
            if value is None:
                delivery.notes.pop(what, None)
            else:
                delivery.notes[what] = value

    def _noted(self, shard: int, raw: bytes, what: str) -> Any:
        with self._lock:
            delivery = self._delivery(shard, raw)
            return None if delivery is None else delivery.notes.get(what)

    def note_failure(self, shard: int, raw: bytes, error: str) -> None:
        self._note(shard, raw, "error", error)

    def last_failure(self, shard: int, raw: bytes) -> str:
        return str(self._noted(shard, raw, "error") or "")

    def note_write(self, shard: int, raw: bytes, condition: str | None) -> None:
        self._note(shard, raw, "write", condition)

    def noted_write(self, shard: int, raw: bytes) -> str | None:
        value = self._noted(shard, raw, "write")
        return None if value is None else str(value)

    def note_retry(self, shard: int, raw: bytes) -> tuple[int, float]:
        with self._lock:
            delivery = self._delivery(shard, raw)
            if delivery is None:
                return 1, 0.0
            retries, since = delivery.notes.get("retries", (0, time.monotonic()))
            delivery.notes["retries"] = (retries + 1, since)
            return retries + 1, time.monotonic() - since

    def retries(self, shard: int, raw: bytes) -> int:
        noted = self._noted(shard, raw, "retries")
        return int(noted[0]) if noted else 0

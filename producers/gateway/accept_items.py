"""What the receiver's accept hands Redis and what Redis answers: one message to enqueue
(:class:`Enqueue`), one event's verdict (:class:`EnqueueResult`), a delivery's
(:class:`BatchResult`), read from the accept script's reply (``scripts/accept.lua``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ...routing.contract.replies import reply_text
from ...routing.contract.schedules import RunLease
from ...routing.hot_records import hot_record
from .redis_calls import as_bytes

Verdict = Literal["accepted", "duplicate", "reused", "full", "fenced", "throttled", "overloaded"]


@hot_record
class EnqueueResult:
    """What Redis said: the verdict and, for ``accepted``/``duplicate``/``reused``, the
    answer given to the first delivery (``full``: the queue depth)."""

    verdict: Verdict
    detail: str
    #: A duplicate's told outcome, once its lane decided it (``routing/contract/outcomes.py``).
    told: bytes | None = None
    #: A duplicate accepted longer ago than a told outcome is kept, none kept: queued
    #: again, for its lane to tell its outcome anew from the journal (``accept.lua``).
    retold: bool = False


@hot_record
class BatchResult:
    """What became of a delivery's events: each one's result (``accepted``, ``duplicate``
    or ``reused``), or the delivery refused as a whole, nothing queued: ``full`` (the
    shard of event ``full_index`` has ``depth`` events waiting), ``throttled`` (its
    source has ``depth`` events waiting, its share of the backlog, while another source's
    wait), ``overloaded`` (its source is past its share and ``depth`` events wait in all,
    past the global mark) or ``fenced``."""

    results: list[EnqueueResult]
    refused: Literal["full", "fenced", "throttled", "overloaded"] | None = None
    full_index: int = 0
    depth: int = 0

    def single(self) -> EnqueueResult:
        """The result of a delivery of one event, a refusal included."""
        if self.refused == "full":
            return EnqueueResult("full", str(self.depth))
        if self.refused == "fenced":
            return EnqueueResult("fenced", "")
        if self.refused in ("throttled", "overloaded"):
            return EnqueueResult(self.refused, str(self.depth))
        return self.results[0]


@hot_record
class Enqueue:
    """One message for a shard queue (an accepted event, or the review message of a
    reused id), with what its dedupe mark keeps."""

    source: str
    event_id: str
    body_sha256: str
    queue: str
    shard: int
    #: The message as the lanes read it (:func:`~keylane.routing.contract.message.event_message`).
    message: bytes
    #: The event's record key, for a broker that routes by a header (RabbitMQ; the Redis
    #: script reads it from the message).
    record_key: str
    retention_ms: int
    #: The 202 answer of an accept, and of its duplicates (the same id and body give the
    #: same answer; the accept script is not sent it). The RabbitMQ receiver's mark keeps it.
    answer: bytes = b""
    #: The shard's high-water mark, and all shards' together (an accept only).
    high_water: int = 0
    global_high_water: int = 0
    key_missing: bool = False
    #: A scheduled run's lease, which must still be held (else ``fenced``, nothing done).
    lease: RunLease | None = None
    #: How long a told outcome is kept (``KEYLANE_OUTCOME_KEEP_S``, an accept only): a
    #: duplicate accepted longer ago, none kept, is retold (:attr:`EnqueueResult.retold`);
    #: 0, never.
    outcome_keep_ms: int = 0


def batch_result(reply: list[Any], items: Sequence[Enqueue]) -> BatchResult:
    """A delivery's reply from the accept script (see ``scripts/accept.lua``) for its
    ``items``, each event's result given the item's own answer (the script is not sent it:
    the same id and body give the same answer)."""
    status = reply_text(reply[0])
    if status == "fenced":
        return BatchResult([], "fenced")
    if status == "full":
        return BatchResult([], "full", int(reply[1]) - 1, int(reply[2]))
    if status in ("throttled", "overloaded"):
        return BatchResult([], status, depth=int(reply[1]))  # type: ignore[arg-type]
    return BatchResult(
        [event_result(reply, 1 + 2 * i, item.answer.decode()) for i, item in enumerate(items)]
    )


def event_result(reply: list[Any], at: int, answer: str) -> EnqueueResult:
    """One event's result in a delivery's reply, from ``at``: its verdict and told outcome."""
    verdict = reply_text(reply[at])
    if verdict == "retell":
        return EnqueueResult("duplicate", answer, retold=True)
    return EnqueueResult(verdict, answer, as_bytes(reply[at + 1]) or None)  # type: ignore[arg-type]

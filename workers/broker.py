"""What the lanes need from the broker that holds the shard queues, one interface per role:
:class:`RecordQueue` for the lanes (take, finish, wait, send), :class:`ShardLeases` for the
ownership (leases and membership), :class:`MessageNotes` for the notes kept with a message
(the lanes, the dispatcher). One implementation per broker in :mod:`keylane.workers.brokers`
(each the only module that imports its client library) is all three roles; the code that
opens a broker (:func:`keylane.workers.brokers.choice.open_lane_broker`) holds it and hands
each part the role it uses.

The shard is the unit of **ownership**: one worker holds a shard's lease at a time, every
acquisition advances the shard's fencing token, and every store write carries the token.
The record is the unit of **order and of waiting**: a shard's owner may have many of its
records in flight at once, each record at most one message (or one batch) in flight, each
record's messages handed out in accepted order. A record that must wait (a back-off, a
destination's limit or ``Retry-After``, a debounce) leaves the lane and becomes due again
later, without holding up its shard-mates; a record held behind an open dead letter is not
handed out until it is released.

What a broker promises (``tests/test_lanes.py`` and the crash tests check it end to end):

* **take** hands out the next due record of a shard whose lease the caller holds, never a
  record already in flight, and never one of another worker's shards;
* **finish** acknowledges (only while the lease is the caller's) and, in the same step,
  may hold the record or hand the caller the shard's next due record;
* a message leaves the broker only when it is acknowledged; a record in flight when its
  owner dies (or pauses past its lease) is due again for the next owner, at its place;
* delivery counts per message survive crashes (poison is seen even when the lane dies).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Lease:
    """A held lease: its value in the broker (``worker/token``) and the fencing token."""

    shard: int
    value: str
    token: int


@dataclass(frozen=True)
class Acquired:
    """The result of an acquisition attempt (``restored``: records of a previous owner
    that were in flight and are due again)."""

    lease: Lease | None
    holder: str
    restored: int


@dataclass(frozen=True)
class Taken:
    """A record handed to a lane: its next message, and the ones taken with it."""

    shard: int
    record_key: str
    raw: bytes
    #: How many times this message has been handed to a lane (more than 1: an earlier
    #: delivery did not finish: a crash, a takeover, a failed attempt).
    deliveries: int = 1
    #: The record is held behind an open dead letter (it was in flight when the hold was
    #: set by an owner that then died): only the message that caused the hold runs.
    held: bool = False
    #: The record's next messages taken with it (first deliveries, in order): a batch.
    followers: tuple[bytes, ...] = ()
    #: Seconds until the shard's earliest other record is due once this one was handed
    #: out (0: one is due now; None: none waits, or the broker does not say): the lane
    #: sets the shard's timer by it, so a waiting record is woken on time even while its
    #: shard-mates are being handled.
    next_due_in_s: float | None = None

    @property
    def messages(self) -> tuple[bytes, ...]:
        """Every message taken, in order."""
        return (self.raw, *self.followers)


@dataclass(frozen=True)
class Idle:
    """Nothing due on the shards asked: per shard, seconds until its first waiting record
    is due (shards with nothing waiting are left out)."""

    due_in_s: dict[int, float]


@dataclass(frozen=True)
class Tell:
    """A decided event's outcome, told with its acknowledgement: ``body`` (a told
    outcome's JSON, ``routing/contract/outcomes.py``) is kept under the event's outcome
    key for ``ttl_ms`` (its dedupe retention) and published to whoever waits for it. A
    key already there is kept (the first tell stands) and published again, unless
    ``replace`` (an operator's retry decided the event anew)."""

    source: str
    event_id: str
    body: bytes
    ttl_ms: int
    replace: bool = False


@dataclass(frozen=True)
class Ack:
    """A message done with: its outcome and counts, and what to tell about it."""

    raw: bytes
    outcome: str = ""
    conflicts: int = 0
    attempts: int = 0
    latency_s: float | None = None
    tell: Tell | None = None
    #: The source whose backlog (fair admission) the message leaves: its accept counted it
    #: in; "" for a message no accept counted (a forward, a retry, a review, a merge step).
    backlog_source: str = ""


@dataclass(frozen=True)
class Outgoing:
    """A message a lane queues to a shard (a merge's next step, a forwarded event), once
    per ``marker``: sent again after a crash, it is not queued twice."""

    marker: str
    shard: int
    record_key: str
    raw: bytes


#: What becomes of a waiting record's delivery counts: ``uncount`` (the attempt was not
#: the message's fault), ``forget`` (a batch, to be taken together again) or ``keep``.
Counts = Literal["uncount", "forget", "keep"]


class RecordQueue(ABC):
    """The shard queues' records as the lanes see them: take, finish, wait, and the
    doorbell that says where a message just came. Thread-safe: the lanes call it from
    their blocking pool."""

    @abstractmethod
    def take(self, leases: Sequence[Lease]) -> Taken | Idle:
        """The next due record of the first of ``leases``' shards that has one."""

    @abstractmethod
    def finish(
        self,
        lease: Lease,
        taken: Taken,
        acks: Sequence[Ack],
        hold: int | None = None,
        then_take: bool = False,
    ) -> Taken | Idle | bool:
        """Acknowledge ``acks`` (messages of ``taken``'s record), hold the record behind
        dead letter ``hold`` if given, and with ``then_take`` hand out the shard's next due
        record (the same record's next message first). False when the lease is not ours
        (nothing was done), True when done and nothing was handed out; with ``then_take``,
        a broker that looked at the shard's queue after the acknowledgement and found
        nothing due may answer :class:`Idle` for the shard instead of True (then no lane
        needs to look there again until a new message or a waiting record's time)."""

    @abstractmethod
    def release_closed(self, lease: Lease, record_key: str, dead_letter_id: int) -> None:
        """The record was held behind ``dead_letter_id`` while an operator closed that
        row (``finish`` with ``hold`` raced ``dlq discard/resolve``, which found no hold to
        release): let its parked messages go, in order. A broker whose hold already
        refuses a closed row (in the same transaction) has nothing to do."""

    @abstractmethod
    def wait(
        self,
        lease: Lease,
        taken: Taken,
        delay_s: float,
        why: dict[str, Any],
        counts: Counts = "keep",
        messages: Sequence[bytes] = (),
    ) -> bool:
        """``taken``'s record leaves the lane and is due again in ``delay_s``; ``why``
        (reason, error, attempts, ...) is shown by status meanwhile; ``counts`` says what
        becomes of ``messages``' delivery counts. False when the lease is not ours."""

    @abstractmethod
    def send(self, messages: Sequence[Outgoing]) -> None:
        """Queue each of ``messages`` at the tail of its shard's queue, in order, and ring
        the shards. Raises :class:`BrokerUnavailable` when the broker cannot take them
        (then some may be queued, and are sent again with the delivery's next try: a
        broker that keeps markers queues a marker's message once; on one that does not,
        the journal of the lane that takes it keeps it to one effect)."""

    @abstractmethod
    def in_flight(self, shard: int) -> list[str]:
        """The shard's records in flight (handed to a lane and not yet finished)."""

    @abstractmethod
    def reclaim(self, lease: Lease, record_keys: Sequence[str], min_age_s: float) -> int:
        """Make due again those of ``record_keys`` that are in flight since ``min_age_s``
        or longer: the owner's lanes hold none of them (a lane that could not finish one,
        a reply that handed one out and was lost). How many; -1 when the lease is not
        ours."""

    @abstractmethod
    def doorbell(self) -> Any:
        """A subscription to the shards that just got a message: ``get_message(timeout)``
        gives dicts whose ``data`` is a shard number; the caller closes it."""

    def flush_counts(self) -> None:  # noqa: B027 (a broker that counts in its ack keeps none)
        """Add the counts this process kept since the last flush (outcomes, latency,
        drain counts) to the deployment's counters; the lanes call it every
        ``counts_flush_ms`` and when they stop. A broker that counts in its
        acknowledgement step keeps none and has nothing to add."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""


class ShardLeases(ABC):
    """The shards' leases and the workers' membership, as the ownership sees them (from its
    heartbeat thread)."""

    @abstractmethod
    def acquire(self, shard: int, worker_id: str, ttl_ms: int) -> Acquired:
        """Take the shard's lease if it is free; a previous owner's in-flight records
        become due again."""

    @abstractmethod
    def renew(self, leases: Sequence[Lease], ttl_ms: int) -> list[bool]:
        """Extend the leases still held; False for each one that was lost."""

    @abstractmethod
    def release_lease(self, lease: Lease, worker_id: str, reason: str = "released") -> bool:
        """Give the lease up (only if still ours); logged as ``reason``."""

    @abstractmethod
    def lose(self, lease: Lease, worker_id: str, why: str) -> None:
        """The worker learned that ``lease`` is gone (the store refused its fence, or it
        could not be renewed): let go of whatever this process still holds of the shard,
        so that the shard's next owner gets its messages, and record why."""

    @abstractmethod
    def bump_fence(self, shard: int, at_least: int) -> int:
        """Raise the shard's fencing counter to ``at_least`` (after the broker lost data)."""

    @abstractmethod
    def heartbeat(self, worker_id: str, info: dict[str, Any], member_ttl_ms: int) -> list[str]:
        """Record this worker as alive and return the live members."""

    @abstractmethod
    def leave(self, worker_id: str) -> None:
        """Remove this worker from the members (graceful stop)."""


class MessageNotes(ABC):
    """Notes kept with an in-flight message, across its deliveries and crashes: why it
    failed last, a write in doubt, a destination's failed calls."""

    @abstractmethod
    def note_failure(self, shard: int, raw: bytes, error: str) -> None:
        """Remember why the last delivery failed (shown when it becomes a dead letter)."""

    @abstractmethod
    def last_failure(self, shard: int, raw: bytes) -> str:
        """The error of the last failed delivery, if any."""

    @abstractmethod
    def note_write(self, shard: int, raw: bytes, condition: str | None) -> None:
        """Remember that a write of the message is about to be sent, conditional on
        ``condition`` (None: no write is in doubt any more)."""

    @abstractmethod
    def noted_write(self, shard: int, raw: bytes) -> str | None:
        """The condition of a write an earlier delivery sent without seeing its answer."""

    @abstractmethod
    def note_retry(self, shard: int, raw: bytes) -> tuple[int, float]:
        """Count one more failed call of the message (apart from its delivery count):
        how many so far, and seconds since the first."""

    @abstractmethod
    def retries(self, shard: int, raw: bytes) -> int:
        """Failed calls of the message so far (see :meth:`note_retry`)."""

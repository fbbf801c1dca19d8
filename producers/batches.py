"""A batched delivery accepted (HubSpot's array, Meta's changes, Salesforce's
notifications, Graph's and Asana's notifications): its events, one per item, all queued
in one step or none of them (:meth:`~keylane.producers.gateway.ReceiverGateway.accept_batch`
on Redis, :meth:`~keylane.producers.amqp.AmqpEventQueue.accept_batch` on RabbitMQ), and
the answer that tells each item's fate, in the order the items came.

Invariant 1 holds for the delivery as a whole: a 2xx only when every item is queued, or
was before (a duplicate), or was recorded for review (an id reused with another body), or
maps to nothing (ignored); a full shard, an overloaded deployment or a broker that cannot
take them answers 503 for the whole delivery, and no mark swallows the sender's retry.
Invariant 2 holds for each item: a retried delivery is a duplicate of each of its items,
whatever else it carries (a re-batched retry too).

With ``Prefer: wait`` the answer waits (up to the time asked) for each new item's outcome:
200 when every one is known, else 202 with the ones known told.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from ..routing.contract.errors import BrokerUnavailable
from ..routing.contract.logcontext import event_context
from ..routing.contract.outcomes import outcome_path, preferred_wait_s
from ..routing.contract.sources import SourceConfig
from .accept import KeptDelivery, NewEvent
from .answers import Answer, batch_answer, waited_batch_answer
from .gateway import BatchResult, EnqueueResult
from .intake import Ignored, Intake
from .outcome_waits import Waiter

if TYPE_CHECKING:
    from ..routing.contract.faults import Faults
    from ..routing.contract.settings import Settings
    from .accept import Acceptor
    from .outcome_reads import OutcomeReads
    from .outcome_waits import OutcomeWaits
    from .queue_watch import QueueWatch


class BatchHost(Protocol):
    """What a batched delivery's accept uses of the receiver it is part of (the
    receiver's own answers, so that a batch is refused as a single event would be)."""

    settings: Settings
    acceptor: Acceptor
    outcomes: OutcomeReads
    waits: OutcomeWaits
    watch: QueueWatch
    faults: Faults

    def event_of(
        self, source: SourceConfig, intake: Intake, kept: KeptDelivery | None = None
    ) -> NewEvent: ...
    def share_of(self, source: SourceConfig) -> int: ...
    def shard_full(self, shard: int, depth: int) -> Answer: ...
    def throttled(self, source: str, waiting: int) -> Answer: ...
    def overloaded(self, waiting: int) -> Answer: ...
    def broker_down(self, exc: BrokerUnavailable) -> Answer: ...


_ENCODE = msgspec.json.Encoder().encode


class BatchAccept:
    """Accepts the events of batched deliveries for a receiver."""

    def __init__(self, receiver: BatchHost) -> None:
        self.receiver = receiver

    async def accept(
        self,
        source: SourceConfig,
        taken: Sequence[Intake | Ignored],
        headers: Mapping[str, str],
        kept: KeptDelivery | None = None,
    ) -> Answer:
        """The answer to a batched delivery whose items were read as ``taken``, each
        event linked to the delivery ``kept``."""
        receiver = self.receiver
        events = [receiver.event_of(source, t, kept) for t in taken if isinstance(t, Intake)]
        if not events:
            items = [_ignored(source, t) for t in taken if isinstance(t, Ignored)]
            return batch_answer(source.name, items, accepted=False, replayed=False)
        wait_s = preferred_wait_s(headers.get("prefer"))
        async with contextlib.AsyncExitStack() as stack:
            waiters: list[Waiter] = []
            if wait_s is not None:  # each registered before the accept: no outcome missed
                for event in events:
                    waiter = receiver.waits.waiting_for(event.source, event.event_id)
                    waiters.append(await stack.enter_async_context(waiter))
            refused, result = await self._accept(source, events)
            if refused is not None:
                return refused
            assert result is not None
            told = await self._outcomes(waiters, result.results, wait_s)
            if wait_s is None:
                await self._retold(source, events, result.results, told)
        return self._answer(source, taken, events, result.results, told, wait_s)

    async def _accept(
        self, source: SourceConfig, events: list[NewEvent]
    ) -> tuple[Answer | None, BatchResult | None]:
        receiver = self.receiver
        receiver.watch.wanted = True  # deliveries come: the watch polls every second
        retention_s = source.retention(receiver.settings)
        batch = source.batch_limit(receiver.settings)
        with event_context(source=source.name, record_key=events[0].record_key):
            receiver.faults.hit("receiver.before_enqueue", events[0].record_key)
            try:
                share = receiver.share_of(source)
                result = await receiver.acceptor.accept_batch(events, retention_s, batch, share)
                if result.refused == "full":
                    event = events[result.full_index]
                    return receiver.shard_full(event.shard, result.depth), None
                if result.refused == "throttled":
                    return receiver.throttled(source.name, result.depth), None
                if result.refused == "overloaded":
                    return receiver.overloaded(result.depth), None
                for event, one in zip(events, result.results, strict=True):
                    if one.verdict == "reused":
                        await receiver.acceptor.record_reuse(event, retention_s)
            except BrokerUnavailable as exc:
                return receiver.broker_down(exc), None
            receiver.faults.hit("receiver.after_enqueue", events[0].record_key)
        return None, result

    async def _outcomes(
        self, waiters: list[Waiter], results: list[EnqueueResult], wait_s: int | None
    ) -> list[bytes | None]:
        """Each event's told outcome: a duplicate's as Redis had it, a new one's as heard
        within the wait (None: not known)."""
        told: list[bytes | None] = [result.told for result in results]
        if wait_s is None:
            return told
        applied_s = min(wait_s, self.receiver.settings.outcome_wait_max_s)
        pending = [i for i, r in enumerate(results) if r.verdict == "accepted" or r.retold]
        heard = await asyncio.gather(*(waiters[i].outcome(applied_s) for i in pending))
        for i, outcome in zip(pending, heard, strict=True):
            told[i] = outcome
        return told

    async def _retold(
        self,
        source: SourceConfig,
        events: list[NewEvent],
        results: list[EnqueueResult],
        told: list[bytes | None],
    ) -> None:
        """Fill in ``told`` the outcomes of the replays queued again to be retold by their
        lanes (``EnqueueResult.retold``), each waited for as a single replay's is."""
        retention_s = source.retention(self.receiver.settings)
        again = [i for i, r in enumerate(results) if r.retold]
        heard = await asyncio.gather(
            *(
                self.receiver.outcomes.retold(events[i].source, events[i].event_id, retention_s)
                for i in again
            )
        )
        for i, outcome in zip(again, heard, strict=True):
            told[i] = outcome

    def _answer(
        self,
        source: SourceConfig,
        taken: Sequence[Intake | Ignored],
        events: list[NewEvent],
        results: list[EnqueueResult],
        told: list[bytes | None],
        wait_s: int | None,
    ) -> Answer:
        bodies: list[bytes] = []
        found = iter(zip(events, results, told, strict=True))
        for item in taken:
            if isinstance(item, Ignored):
                bodies.append(_ignored(source, item))
                continue
            event, result, outcome = next(found)
            bodies.append(_item_body(event, result, outcome))
        verdicts = {result.verdict for result in results}
        if wait_s is None:
            replayed = verdicts <= {"duplicate"}
            return batch_answer(source.name, bodies, "accepted" in verdicts, replayed)
        undecided = sum(
            1 for r, t in zip(results, told, strict=True) if t is None and r.verdict != "reused"
        )
        applied_s = min(wait_s, self.receiver.settings.outcome_wait_max_s)
        return waited_batch_answer(source.name, bodies, undecided, applied_s)


def _ignored(source: SourceConfig, item: Ignored) -> bytes:
    return _ENCODE(
        {
            "status": "ignored",
            "source": source.name,
            "event_type": item.event_type,
            "reason": item.reason,
        }
    )


def _item_body(event: NewEvent, result: EnqueueResult, told: bytes | None) -> bytes:
    """One item's part of the answer, as a delivery of it alone would be answered: its
    told outcome when known, else its accept's answer; ``"replayed": true`` when it was
    seen before (a single delivery's ``Keylane-Replayed``)."""
    if result.verdict == "reused":
        body: dict[str, Any] = {
            "status": "reused",
            "source": event.source,
            "event_id": event.event_id,
            "detail": "this id was delivered before with another body; recorded for review",
        }
        return _ENCODE(body)
    answer = told or (result.detail.encode() if result.detail else event.answer)
    if result.verdict == "duplicate":
        return answer[:-1] + b',"replayed":true}'
    if told is not None:
        return answer
    return answer[:-1] + b',"outcome":' + _ENCODE(outcome_path(event.source, event.event_id)) + b"}"

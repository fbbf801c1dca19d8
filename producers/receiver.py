"""The webhook receiver: ``POST /webhooks/{source}`` (and the ``GET`` of a sender's
handshake), ``GET /outcomes/...``, ``GET /healthz``, ``GET /readyz``, and nothing else:
this is the port put on the internet. ``/metrics`` is served on the operations listener
(``ops/operations.py``), the bounds on each client below the app
(:mod:`keylane.producers.client_bounds`).

The receiver is thin on purpose: it checks, dedupes and enqueues, and never touches the
record store. A delivery goes through the same steps whatever its sender
(``ops/docs/senders.md``): **verify** over the bytes as they came, **read** the body by
its media type into one tree (:mod:`keylane.producers.formats`), answer a handshake
(:mod:`keylane.producers.handshakes`), **map** it to one event or, for a batched sender,
one per item (:mod:`keylane.producers.intake`), then accept them all in one step. Its
answers (the external contract, ``ops/docs/concepts.md``):

* 202 accepted, with event id, record key and shard (and ``key_missing`` when the sender
  gave no event id); 200 ``ignored`` when the source maps nothing for the event type;
* 200 duplicate, replaying the first delivery's answer (``Keylane-Replayed: true``);
* a batched delivery: one such answer per item, 202 if any item was new;
* 400 malformed or invalid, 401 failed check, 404 unknown source, 409 same id with a
  different body (queued for review), 413 too large (or too many items), 415 a media type
  keylane does not read;
* 503 with ``Retry-After`` when the shard or all shards together are over their
  high-water mark (derived from how fast they drain), or Redis is down;
* for a sender that expects its own answer (Salesforce, Twilio), that answer in a 2xx.

No 2xx is sent before Redis has run the accept script (:mod:`keylane.producers.gateway`); no
4xx changes any state; a refusal never marks the event as seen.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import replace

import sentry_sdk
from starlette.requests import Request
from starlette.responses import Response

from ..routing.contract.errors import BrokerUnavailable, InvalidEvent, SignatureError
from ..routing.contract.faults import Faults
from ..routing.contract.logcontext import event_context
from ..routing.contract.outcomes import http_status_of, preferred_wait_s
from ..routing.contract.settings import Settings
from ..routing.contract.sources import SourceConfig, Sources
from .accept import Acceptor, KeptDelivery, NewEvent, new_event
from .answers import (
    REPLAYED,
    Answer,
    error_answer,
    ignored_answer,
    reused_detail,
    told_answer,
)
from .batches import BatchAccept
from .body import Receive, discard_body, read_body
from .broker import EventQueue
from .delivery import Taken, check_public_url, query_params, read_verified, target_of
from .door import Door, DoorCounts, Seen, kept_for
from .faults import crash
from .gateway import EnqueueResult
from .handshakes import Handshakes
from .intake import Ignored, Intake, Parts, load_hook
from .outcome_reads import OutcomeReads, source_tokens
from .outcome_waits import OutcomeWaits
from .queue_watch import QueueWatch
from .receiver_metrics import ReceiverMetrics
from .signatures import Target, Verifier, verifiers_of
from .wire_choice import WireVersionGauge

log = logging.getLogger("keylane.receiver")

BROKER_DOWN_RETRY_AFTER_S = 5


class Receiver:
    """The receiver's state: settings, sources and their verifiers, the accept path,
    the queue watch and the metrics."""

    def __init__(
        self,
        settings: Settings,
        sources: Sources,
        queue: EventQueue,
        environ: Mapping[str, str] | None = None,
        verifiers: Mapping[str, Verifier] | None = None,
    ) -> None:
        """``verifiers``: each source's check, else each built with its secrets from
        ``environ`` (a kept delivery run again passes the check it passed when it came,
        and takes no outcome reads: :mod:`keylane.producers.rerun`)."""
        self.settings = settings
        self.sources = sources
        self.queue = queue
        self.acceptor = Acceptor(settings, queue)
        environ = os.environ if environ is None else environ
        self.waits = OutcomeWaits(queue.redis.outcome_feed)
        tokens = source_tokens(sources, environ) if verifiers is None else {}
        self.outcomes = OutcomeReads(settings, queue.redis, self.waits, tokens, sources)
        self.watch = QueueWatch(queue.redis)
        self.metrics = ReceiverMetrics(self.watch, queue.redis)
        self.metrics.registry.register(WireVersionGauge(self.acceptor.wire))
        self.door = Door(queue.redis.door, settings.door_keep, settings.keep_deliveries)
        self.metrics.registry.register(DoorCounts(self.door))
        self.faults = Faults(settings.faults, crash)
        self.verifiers = (
            dict(verifiers) if verifiers is not None else verifiers_of(sources, environ)
        )
        self.handshakes = Handshakes(sources, self.verifiers, environ, queue.redis)
        self.hooks = {s.name: load_hook(s) for s in sources.all()}
        self.batches = BatchAccept(self)
        self._keyless_seen: set[str] = set()
        built_in = settings.sources_file is None
        for source in sources.all():
            check_public_url(source, settings)
            for warning in source.start_up_warnings(built_in):
                log.warning("%s", warning)

    # -- routes ---------------------------------------------------------------------------

    async def webhook(
        self,
        name: str,
        headers: dict[str, str],
        receive: Receive,
        path: str = "",
        query: bytes = b"",
    ) -> Answer:
        """``POST /webhooks/{source}``: the answer to one delivery (``path`` and ``query``:
        the request's, for senders that sign or carry them). Every refusal of a known
        source passes here, and is kept once decided (:mod:`keylane.producers.door`)."""
        source = self.sources.get(name)
        if source is None:
            await discard_body(headers, receive)
            return self.refuse(404, "unknown_source", f"no source named {name!r}")
        seen = Seen()
        read = await self.read(source, headers, receive, path, query, seen)
        if isinstance(read, Answer):
            answer = read
        else:
            kept = kept_for(source, self.settings, read.events, headers, path, query, seen)
            answer = await self.admit(source, read.events, headers, kept)
            answer = answer.as_reply(source.reply)
        if (answer.status >= 400 and not answer.told) or seen.ignored is not None:
            self.door.keep(source, headers, path, query, answer, seen)
        return answer

    async def read(
        self,
        source: SourceConfig,
        headers: dict[str, str],
        receive: Receive,
        path: str,
        query: bytes,
        seen: Seen,
    ) -> Answer | Taken:
        """The delivery read, checked and mapped (:class:`Taken`), or the answer it gets
        without being accepted: a handshake's, or a refusal."""
        name = source.name
        try:
            form, body = await read_body(
                headers, receive, self.settings.max_body_bytes, source.body_format
            )
            seen.body = body
            params = query_params(query)
            if source.handshake is not None:
                early = await self.handshakes.before_verify(source, headers, params, body)
                if early is not None:
                    return early
            target = target_of(source, self.settings, path, query, params)
            parts = Parts(body, headers, params, form)
            # A verifier raises only SignatureError: past it, the delivery is verified.
            seen.verified = True
            return read_verified(
                source,
                self.verifiers[name],
                self.handshakes,
                parts,
                target,
                time.time(),
                self.hooks[name],
                self.settings.max_batch_items,
            )
        except SignatureError as exc:
            seen.verified = False
            log.info("refused a delivery for %s: %s", source.name, exc)
            return self.refuse(401, "bad_signature", str(exc))
        except InvalidEvent as exc:
            return self.refuse(exc.status, exc.code, str(exc))

    async def admit(
        self,
        source: SourceConfig,
        taken: list[Intake | Ignored],
        headers: dict[str, str],
        kept: KeptDelivery | None = None,
    ) -> Answer:
        """The answer to a delivery read as ``taken`` (from the delivery ``kept``): its
        events accepted (or not), in keylane's own answer form."""
        try:
            if source.items_rule is not None:
                return await self.batches.accept(source, taken, headers, kept)
            (intake,) = taken
            if isinstance(intake, Ignored):
                return ignored_answer(source.name, intake.event_type, intake.reason)
            event = self.event_of(source, intake, kept)
        except InvalidEvent as exc:
            return self.refuse(exc.status, exc.code, str(exc))
        with event_context(
            source=event.source,
            event_id=event.event_id,
            record_key=event.record_key,
            shard=event.shard,
        ):
            try:
                wait_s = preferred_wait_s(headers.get("prefer"))
                if wait_s is None:
                    return await self._accept(source, event, retold_wait=True)
                return await self._accept_waiting(source, event, wait_s)
            except Exception as exc:
                sentry_sdk.capture_exception(exc)  # here, with the event's tags
                raise

    async def handshake_get(
        self, name: str, headers: dict[str, str], query: bytes
    ) -> Answer | None:
        """``GET /webhooks/{source}``: a sender's check of its URL (Meta, Mailchimp), or
        None (405) for a source whose sender sends none."""
        source = self.sources.get(name)
        if source is None or source.handshake not in ("meta", "mailchimp"):
            return None
        params = query_params(query)
        verified = True
        if source.handshake == "mailchimp":
            try:
                self.verifiers[name].verify(headers, b"", time.time(), Target("GET", "", params))
            except SignatureError as exc:
                return self.refuse(401, "bad_signature", str(exc))
        return await self.handshakes.get(source, params, verified)

    async def healthz(self, request: Request) -> Response:
        """Liveness: the process answers."""
        return Response(b'{"status":"ok"}', media_type="application/json")

    async def readyz(self, request: Request) -> Response:
        """Readiness: Redis answers, so deliveries can be accepted."""
        if await self.queue.ping():
            return Response(b'{"status":"ready"}', media_type="application/json")
        return self.refuse(
            503,
            "broker_unavailable",
            "Redis does not answer",
            retry_after=BROKER_DOWN_RETRY_AFTER_S,
        ).response()

    # -- accepting --------------------------------------------------------------------------

    def warn_keyless(self, source: SourceConfig) -> None:
        """Say once per source and process that a delivery was keyless (they are counted
        in ``keylane status``; the first one is said out loud, since its sender's retries
        will run again)."""
        if source.name in self._keyless_seen:
            return
        self._keyless_seen.add(source.name)
        log.warning(
            "source %s: a delivery had no event id at %s and was accepted as keyless; a "
            "retry of it will be applied again (counted as keyless in keylane status)",
            source.name,
            source.event_id_rule,
        )

    def event_of(
        self, source: SourceConfig, intake: Intake, kept: KeptDelivery | None = None
    ) -> NewEvent:
        """The event to accept for ``intake`` (a task or destination gets its ``text``),
        linked to the delivery ``kept`` it came from."""
        if intake.key_missing:
            self.warn_keyless(source)
        return new_event(
            self.settings.shards,
            source=source.name,
            event_id=intake.event_id,
            event_type=intake.event_type,
            record_key=intake.record_key,
            changes=intake.changes,
            body_sha256=intake.digest,
            key_missing=intake.key_missing,
            destination=source.destination_name,
            body=intake.text,
            conditions=intake.conditions,
            if_revision=intake.if_revision,
            identities=intake.identities,
            delivery=kept.delivery_id if kept is not None else None,
            request=kept.request if kept is not None else None,
        )

    def overloaded(self, waiting: int) -> Answer:
        """503 when the events waiting over all shards are past the global high-water mark
        and the delivery's source is past its share of them."""
        return self.refuse(
            503,
            "overloaded",
            f"{waiting} events are waiting over all shards; retry later",
            retry_after=self.watch.retry_after_global(self.settings.global_high_water),
        )

    def broker_down(self, exc: BrokerUnavailable) -> Answer:
        """503 when the broker cannot take the event now."""
        log.error("cannot enqueue: %s", exc)
        return self.refuse(
            503,
            "broker_unavailable",
            "cannot enqueue now; retry later",
            retry_after=BROKER_DOWN_RETRY_AFTER_S,
        )

    def share_of(self, source: SourceConfig) -> int:
        """The most of ``source``'s events that may wait while another source's do."""
        return max(1, int(source.backlog_share * self.settings.global_high_water))

    def throttled(self, source: str, waiting: int) -> Answer:
        """429 when ``source`` is over its share of the backlog while other sources'
        events wait: its sender slows down, the others are still accepted."""
        return self.refuse(
            429,
            "throttled",
            f"source {source} has {waiting} events waiting, its share of the backlog while "
            "other sources' events wait; retry later",
            retry_after=self.watch.retry_after_global(self.settings.global_high_water),
        )

    def shard_full(self, shard: int, depth: int) -> Answer:
        """503 when ``shard`` is over its high-water mark."""
        return self.refuse(
            503,
            "shard_full",
            f"shard {shard} has {depth} events waiting; retry later",
            retry_after=self.watch.retry_after(shard, depth, self.settings.shard_high_water),
        )

    async def _accept(
        self, source: SourceConfig, event: NewEvent, retold_wait: bool = False
    ) -> Answer:
        """Accept ``event``; with ``retold_wait`` (a request that does not wait for its
        outcome), a replay its lane is asked to tell again (:meth:`retold`) is answered
        that outcome when it comes within ``KEYLANE_OUTCOME_REPLAY_WAIT_S``."""
        self.watch.wanted = True  # deliveries come: the watch polls every second
        retention_s = source.retention(self.settings)
        self.faults.hit("receiver.before_enqueue", event.record_key)
        try:
            batch = source.batch_limit(self.settings)
            share = self.share_of(source)
            result = await self.acceptor.accept(event, retention_s, batch, share=share)
            if result.verdict == "reused":
                await self.acceptor.record_reuse(event, retention_s)
            if result.retold and retold_wait:
                told = await self.outcomes.retold(event.source, event.event_id, retention_s)
                result = replace(result, told=told)
        except BrokerUnavailable as exc:
            return self.broker_down(exc)
        self.faults.hit("receiver.after_enqueue", event.record_key)
        return self._answer(result, event)

    async def _accept_waiting(self, source: SourceConfig, event: NewEvent, wait_s: int) -> Answer:
        """:meth:`_accept` for a delivery that asks to wait ``wait_s`` for its outcome
        (``Prefer: wait``, capped by ``KEYLANE_OUTCOME_WAIT_MAX_S``): registered before
        the accept, so an outcome told after it is heard (see
        :mod:`keylane.producers.outcome_waits`)."""
        applied_s = min(wait_s, self.settings.outcome_wait_max_s)
        async with self.waits.waiting_for(event.source, event.event_id) as waiter:
            answer = await self._accept(source, event)
            if answer.status not in (200, 202) or answer.told:
                return answer
            told = await waiter.outcome(applied_s)
        return told_answer(told, answer, applied_s, event.source, event.event_id)

    def _answer(self, result: EnqueueResult, event: NewEvent) -> Answer:
        if result.verdict == "accepted":
            return Answer(202, result.detail.encode())
        if result.verdict == "duplicate" and result.told is not None:
            # Decided already: the stored outcome, not only the first 202.
            answer = Answer(http_status_of(result.told), result.told, [REPLAYED])
            answer.told = True
            return answer
        if result.verdict == "duplicate":
            return Answer(200, result.detail.encode(), [REPLAYED])
        if result.verdict == "reused":
            return self.refuse(409, "id_reused", reused_detail(event.event_id))
        if result.verdict == "throttled":
            return self.throttled(event.source, int(result.detail))
        if result.verdict == "overloaded":
            return self.overloaded(int(result.detail))
        return self.shard_full(event.shard, int(result.detail))

    def refuse(self, status: int, code: str, detail: str, retry_after: int | None = None) -> Answer:
        """An error answer (JSON ``{"error", "detail"}``), counted by reason."""
        self.metrics.refused.labels(code).inc()
        return error_answer(status, code, detail, retry_after)

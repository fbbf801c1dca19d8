"""``keylane worker``: a Celery worker process that hosts the lanes.

Celery gives the process its life cycle (warm shutdown on SIGTERM/SIGINT), heartbeats and
remote control, so Flower and ``celery inspect`` see it; the lanes run beside Celery's
consumer as a worker bootstep.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

from celery import bootsteps
from celery.exceptions import SecurityWarning
from celery.worker.consumer import Consumer
from celery.worker.control import control_command, inspect_command
from kombu.entity import Queue

from ..routing.contract.events import Event
from ..routing.contract.settings import Settings
from ..routing.router import EVENT_TASK
from ..routing.shards import QUEUE_PREFIX
from .app import create_app
from .brokers.choice import CONTROL_QUEUE, shard_queue_name, writer_claim_broker
from .results import ApplyResult
from .service import LaneService, new_worker_id
from .writer import StoreWriter

log = logging.getLogger("keylane.worker")


class TaskEvents:
    """Celery task events for what the lanes do, so Flower shows keylane's work as it
    happens: an event a lane takes is ``RECEIVED`` and ``STARTED``, a record that waits
    (a back-off, a destination's limit, a debounce) puts its event in ``RETRY`` with the
    reason, an applied or duplicate event is ``SUCCESS`` with the outcome, a dead letter is
    ``FAILURE`` with its reason. Every row is named ``keylane.event``; its args are the
    record key, the source and the event id, so Flower's search finds a record. Best
    effort: an event that cannot be sent is dropped, never retried, never in the way of a
    lane (implements :class:`keylane.workers.lane_record.LaneEvents`).

    The lanes' loop only notes what happened (a tuple, with the time it happened); a
    thread of its own builds Celery's events from the notes and publishes them in batches
    (Celery's ``task.multi`` messages, which Flower reads): at most ``BATCH`` events or
    ``FLUSH_S`` seconds late. Building and encoding them was a sixth of the loop's CPU
    when done on it, and the loop runs every lane.
    """

    BATCH = 100
    FLUSH_S = 1.0
    KEPT = 50 * BATCH

    def __init__(self, app: Any, hostname: str) -> None:
        self._lock = threading.Lock()  # the dispatcher: the flusher, and close()
        self._connection = app.connection_for_write()
        self._dispatcher = app.events.Dispatcher(
            self._connection,
            hostname=hostname,
            enabled=True,
            buffer_while_offline=False,
            buffer_group=["task"],
            buffer_limit=self.BATCH,
        )
        #: What the lanes noted, oldest first: (what, time.time(), arguments); the oldest
        #: are dropped when the events cannot be sent for long.
        self._notes: deque[tuple[str, float, tuple[Any, ...]]] = deque(maxlen=self.KEPT)
        self._due = threading.Event()  # a batch is waiting, or stopping
        self._stop = threading.Event()
        self._flusher = threading.Thread(
            target=self._flush_often, name="keylane-task-events", daemon=True
        )
        self._flusher.start()

    def _flush_often(self) -> None:
        while not self._stop.is_set():
            self._due.wait(self.FLUSH_S)
            self._due.clear()
            self._flush()

    def _flush(self) -> None:
        try:
            with self._lock:
                while self._notes:
                    what, at, args = self._notes.popleft()
                    for kind, fields in _BUILD[what](*args):
                        self._dispatcher.send(kind, timestamp=at, **fields)
                self._dispatcher.flush(errors=False, groups=True)
        except Exception as exc:
            log.debug("task events not sent: %s", exc)

    def _note(self, what: str, *args: Any) -> None:
        self._notes.append((what, time.time(), args))
        if len(self._notes) >= self.BATCH:
            self._due.set()

    def started(self, task_id: str, event: Event, attempt: int) -> None:
        self._note("started", task_id, event.record_key, event.source, event.event_id, attempt)

    def waiting(
        self, task_id: str, event: Event, reason: str, detail: str, delay_s: float, attempts: int
    ) -> None:
        self._note("waiting", task_id, reason, detail, delay_s, attempts)

    def finished(self, task_id: str, event: Event, result: ApplyResult, runtime_s: float) -> None:
        if result.outcome == "dead_lettered":
            self._note("failed", task_id, result.dead_letter_id, result.reason)
        else:
            self._note("succeeded", task_id, result.outcome, runtime_s)

    def close(self) -> None:
        """Send what is noted, then release the connection."""
        self._stop.set()
        self._due.set()
        self._flusher.join(5)
        self._flush()
        with self._lock:
            self._dispatcher.close()
            self._connection.release()


_Fields = list[tuple[str, dict[str, Any]]]


def _started(task_id: str, record_key: str, source: str, event_id: str, attempt: int) -> _Fields:
    return [
        (
            "task-received",
            {
                "uuid": task_id,
                "name": EVENT_TASK,
                "args": repr((record_key, source, event_id)),
                "kwargs": repr({"event": f"{source}/{event_id}", "attempt": attempt}),
                "root_id": task_id,
                "parent_id": None,
                "retries": max(0, attempt - 1),
                "eta": None,
                "expires": None,
            },
        ),
        ("task-started", {"uuid": task_id}),
    ]


def _waiting(task_id: str, reason: str, detail: str, delay_s: float, attempts: int) -> _Fields:
    why = f"{reason}: {detail}" if detail else reason
    text = f"{why} after {attempts} attempt(s); the record waits {delay_s:.1f}s, its "
    exception = text + "shard-mates go on"
    return [("task-retried", {"uuid": task_id, "exception": exception, "traceback": ""})]


def _failed(task_id: str, dead_letter_id: int | None, reason: str | None) -> _Fields:
    message = f"dead letter {dead_letter_id}: {reason}"
    return [("task-failed", {"uuid": task_id, "exception": message, "traceback": ""})]


def _succeeded(task_id: str, outcome: str, runtime_s: float) -> _Fields:
    fields = {"uuid": task_id, "result": repr(outcome), "runtime": runtime_s}
    return [("task-succeeded", fields)]


#: The Celery events of each kind of note.
_BUILD: dict[str, Callable[..., _Fields]] = {
    "started": _started,
    "waiting": _waiting,
    "failed": _failed,
    "succeeded": _succeeded,
}


class LaneStep(bootsteps.StartStopStep):
    """Starts the lane service after the worker is up; stops it first on shutdown."""

    label = "keylane lanes"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.service: LaneService | None = None
        self.events: TaskEvents | None = None

    def start(self, worker: Any) -> None:
        settings: Settings = worker.app.keylane_settings
        self.events = TaskEvents(worker.app, worker.hostname) if settings.task_events else None
        worker_id = getattr(worker.app, "keylane_worker_id", None)
        self.service = LaneService(settings, worker_id, events=self.events)
        worker.keylane_service = self.service
        self.service.start()

    def stop(self, worker: Any) -> None:
        if self.service is not None:
            self.service.stop()
            self.service = None
        if self.events is not None:
            self.events.close()
            self.events = None

    def shutdown(self, worker: Any) -> None:
        self.stop(worker)


@control_command(
    args=[("queue", str), ("exchange", str), ("exchange_type", str), ("routing_key", str)],
    signature="<queue> [exchange [type [routing_key]]]",
)
def add_consumer(
    state: Any,
    queue: str,
    exchange: str | None = None,
    exchange_type: str | None = None,
    routing_key: str | None = None,
    **options: Any,
) -> dict[str, str]:
    """Celery's ``add_consumer``, except for keylane's shard queues: those are consumed by
    the lanes under shard leases, and a second, plain consumer would break per-record
    order (Flower's "Add consumer" button calls this)."""
    if queue.startswith(QUEUE_PREFIX):
        return {"error": f"refused: {queue} is a keylane shard queue, consumed by its lanes"}
    state.consumer.call_soon(
        state.consumer.add_task_queue,
        queue,
        exchange,
        exchange_type or "direct",
        routing_key,
        **options,
    )
    return {"ok": f"add consumer {queue}"}


@inspect_command()
def active_queues(state: Any) -> list[dict[str, Any]]:
    """The queues this worker consumes: the control queue and the shards it owns now.

    Replaces Celery's command of the same name, which only knows Celery's own consumer;
    Flower's broker page reads this list to know which queue depths to show.
    """
    names = [CONTROL_QUEUE]
    service: LaneService | None = getattr(state.consumer.controller, "keylane_service", None)
    if service is not None:
        owned = sorted(service.ownership.owned())
        names += [shard_queue_name(service.settings, shard) for shard in owned]
    return [dict(Queue(name).as_dict(recurse=True)) for name in names]


class CeleryConsumer(Consumer):
    """Celery's consumer without its native delayed delivery. Celery includes that step
    when a queue is a quorum queue, as the control queue is on RabbitMQ; it would declare
    28 ``celery_delayed_*`` quorum queues and their exchanges on the cluster and log a
    warning for every queue of the app at each start, for ETA tasks keylane never sends
    (a record's waits are its lane's own)."""

    class Blueprint(Consumer.Blueprint):
        default_steps = [
            step
            for step in Consumer.Blueprint.default_steps
            if not step.endswith(":DelayedDelivery")
        ]


def run_worker(settings: Settings, loglevel: str = "INFO") -> None:
    """Run a worker in this process until it is told to stop. On SQLite, first become the
    store's one writer, or raise :class:`ConfigError` (another worker is)."""
    worker_id = new_worker_id()
    broker = writer_claim_broker(settings)
    if broker is not None:
        try:
            StoreWriter(broker, settings, worker_id).claim()
        finally:
            broker.close()
    app = create_app(settings)
    app.keylane_settings = settings
    app.keylane_worker_id = worker_id
    app.steps["worker"].add(LaneStep)
    # Celery warns a root process against unpickling messages; keylane's app accepts JSON
    # only (Celery's default accept_content), so the warning is about nothing it does.
    warnings.filterwarnings("ignore", category=SecurityWarning)
    worker = app.Worker(
        hostname=f"keylane-{os.getpid()}@{socket.gethostname()}",
        pool="solo",
        concurrency=1,
        consumer_cls=CeleryConsumer,
        queues=[CONTROL_QUEUE],
        without_mingle=True,
        without_gossip=True,
        loglevel=loglevel,
        quiet=True,  # no banner: keylane logs what the worker runs in one line
    )
    worker.start()
    raise SystemExit(worker.exitcode)

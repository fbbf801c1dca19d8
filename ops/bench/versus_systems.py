"""The systems the versus benchmark compares, each started once and then given every case:
keylane (``keylane serve`` and ``keylane worker`` processes) and the Celery baselines
(:mod:`keylane.ops.bench.versus_celery`). Each run sends one case's workload, waits until
every delivery is applied (or the case's time is up), and reads back the records and
when each event was applied.

Each system's processes are started through :meth:`Bench.start`, so they are stopped (by
pid) when the benchmark's exit stack unwinds, whatever happens.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import redis

from ...routing import ShardMap
from ...routing.contract.replies import reply_int
from ...routing.redis_keys import RedisKeys
from ...workers.store_rows import DeadLetterFilter
from ...workers.stores import open_store
from ..deployment_view import DeploymentView
from ..embedded_redis import free_port
from .phases import all_shards_owned, run_audit
from .procs import (
    Bench,
    BenchFailure,
    Child,
    keylane_argv,
    wait_for,
)
from .versus_celery import (
    LOCKED_TASK,
    PING_TASK,
    PLAIN_QUEUE,
    POOL_QUEUE,
    RMW_TASK,
    CeleryConfig,
    create_app,
    hashed_queue,
    queue_for,
    worker_argv,
)
from .versus_dest import Table, table_name
from .versus_handler import event_type
from .versus_send import Sent, http_sender, publisher, send_all
from .versus_work import Delivery, Effects, Workload, check_effects

SOURCE = "versus"
BATCH_SOURCE = "versus-batch"
SOURCES_TOML = f"""
[sources.{SOURCE}]
verify = {{ scheme = "none" }}
format = "keylane"
owns = ["total", "seqs"]
handler = "keylane.ops.bench.versus_handler:read_sleep_write"
batch = 1

[sources.{BATCH_SOURCE}]
verify = {{ scheme = "none" }}
format = "keylane"
owns = ["total", "seqs"]
batch_handler = "keylane.ops.bench.versus_handler:read_sleep_write_batch"
"""
POLL_S = 0.05
#: Concurrent senders, as in the issue's reference measurements.
SENDERS = 32


@dataclass(frozen=True)
class Case:
    """One workload at one destination latency."""

    work: Workload
    latency_ms: int
    tag: str  # unique within the invocation; names the records and event ids

    @property
    def latency_s(self) -> float:
        """The latency in seconds."""
        return self.latency_ms / 1000

    def timeout_s(self, processes: int) -> float:
        """How long a system may take before its run is called incomplete."""
        bound = max(
            self.work.critical_path_s(self.latency_s),
            self.work.slots_bound_s(self.latency_s, processes),
        )
        return 60 + 5 * bound

    @property
    def key_prefix(self) -> str:
        """What the record keys of this case start with."""
        return f"versus:{self.tag}:"

    def record_key(self, record: int) -> str:
        """The key of ``record`` (the same in every system: each has its own table)."""
        return f"{self.key_prefix}{record}"

    def busiest(self, place: Callable[[str], object]) -> int:
        """Events of the busiest place (shard, queue) when each record's key is put in
        ``place(key)``: one process applies them one at a time."""
        counts = Counter(place(self.record_key(r)) for r in self.work.event_records)
        return max(counts.values())


@dataclass
class SystemRun:
    """What one system did with one case."""

    system: str
    case: Case
    sent: Sent
    #: Per event (by ``seq``): when it was first applied (``time.time()``), if it was.
    applied_at: list[float | None]
    effects: Effects
    #: CPU seconds the system's processes used during the run (not the senders').
    cpu_s: float
    extra: dict[str, int] = field(default_factory=dict)  # lock retries, dead letters
    #: CPU seconds of its worker processes alone (keylane: not the receiver's; a Celery
    #: setup's processes are all workers).
    worker_cpu_s: float | None = None
    #: CPU seconds the other systems' idle processes used meanwhile (their noise).
    others_cpu_s: float = 0.0

    @property
    def applied(self) -> int:
        """Events applied at least once."""
        return sum(t is not None for t in self.applied_at)

    @property
    def elapsed_s(self) -> float | None:
        """From the first send until the last event was applied."""
        times = [t for t in self.applied_at if t is not None]
        return max(times) - self.sent.first_send_at if times else None

    @property
    def applied_per_s(self) -> float | None:
        """Events applied per second (``elapsed_s``)."""
        elapsed = self.elapsed_s
        return self.applied / elapsed if elapsed else None

    def latencies_ms(self) -> list[float]:
        """Per applied event: from the acceptance of its first delivery to its first effect."""
        first: dict[int, float] = {}
        for delivery in self.case.work.deliveries:
            accepted = self.sent.accepted_at[delivery.index]
            if accepted is not None and delivery.seq not in first:
                first[delivery.seq] = accepted
        return [
            (applied - first[seq]) * 1000
            for seq, applied in enumerate(self.applied_at)
            if applied is not None and seq in first
        ]


def _cpu_s(children: list[Child]) -> float:
    return sum(c.tree_cpu_s() for c in children)


def _wait_until(done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(POLL_S)
    return done()


class KeylaneSystem:
    """``keylane serve`` and ``workers`` ``keylane worker`` processes of ``lanes`` lanes,
    on the benchmark's namespace and store, with the versus sources: ``keylane`` sends to
    the one that applies each event on its own (batch = 1); ``keylane-batch`` (``batch_of``
    a started ``keylane``: the same processes) to the one whose lanes take a record's
    waiting events together."""

    def __init__(
        self, bench: Bench, workers: int, lanes: int, batch_of: KeylaneSystem | None = None
    ) -> None:
        self.bench = bench
        self.lanes = lanes
        self.workers = workers
        self.owner: KeylaneSystem = batch_of or self  # whose processes these are
        self.name = "keylane" if batch_of is None else "keylane-batch"
        self.source = SOURCE if batch_of is None else BATCH_SOURCE
        self.url = ""
        self.processes: list[Child] = []
        if batch_of is None:
            self.store = open_store(bench.store_url)
            bench.es.callback(self.store.close)
        else:
            self.store = batch_of.store

    @property
    def children(self) -> list[Child]:
        """The processes (shared by ``keylane`` and ``keylane-batch``)."""
        return self.owner.processes

    @property
    def label(self) -> str:
        """How it was run."""
        batch = ", batching a record's waiting events" if self.source == BATCH_SOURCE else ""
        return f"{self.name} ({self.workers} workers x {self.lanes} lanes{batch})"

    def cpu_now(self) -> float:
        """CPU seconds its processes have used so far."""
        return _cpu_s(self.children)

    def start(self) -> None:
        """Start the receiver and the workers; wait until every shard is owned."""
        if self.owner is not self:
            return
        bench = self.bench
        sources = bench.tmp / "versus-sources.toml"
        sources.write_text(SOURCES_TOML)
        bench.env["KEYLANE_SOURCES_FILE"] = str(sources)
        port = free_port()
        receiver = bench.start(
            "versus-receiver", keylane_argv("serve", "--port", str(port), "--ops-port", "0")
        )
        self.url = f"http://127.0.0.1:{port}"
        workers = [
            bench.start(f"versus-worker-{n}", keylane_argv("worker", "--lanes", str(self.lanes)))
            for n in range(self.workers)
        ]
        self.processes = [receiver, *workers]
        bench.wait_http(receiver, f"{self.url}/readyz")
        view = DeploymentView(bench.redis, RedisKeys(bench.namespace), ShardMap(bench.opts.shards))
        wait_for(
            lambda: all_shards_owned(view, bench.opts.shards, workers, bench.logs_tail),
            120,
            "every shard to be owned by the keylane workers",
            bench.logs_tail,
            0.2,
        )
        self.store.migrate()

    def run(self, shown: Case) -> SystemRun:
        """Post the case's deliveries, wait for the journal, read the records back."""
        # keylane and keylane-batch share one store: their records and ids must differ
        case = shown if self.owner is self else replace(shown, tag=f"{shown.tag}b")
        work = case.work
        journal0 = self.store.journal_size()
        dead0 = self._dead_letters()
        cpu0 = _cpu_s(self.children)
        workers_cpu0 = _cpu_s(self.children[1:])

        def body_of(delivery: Delivery) -> bytes:
            return _envelope(case, delivery)

        url = f"{self.owner.url}/webhooks/{self.source}"
        sent = send_all(work, SENDERS, lambda: http_sender(url, body_of))
        _wait_until(
            lambda: self.store.journal_size() - journal0 >= work.events,
            case.timeout_s(self.workers * self.lanes),
        )
        cpu_s = _cpu_s(self.children) - cpu0
        workers_cpu_s = _cpu_s(self.children[1:]) - workers_cpu0
        applied_at: list[float | None] = [None] * work.events
        found: dict[int, tuple[int, list[int]]] = {}
        for record in range(work.records):
            key = case.record_key(record)
            fields = self.store.read(key).fields
            if fields:
                found[record] = (int(fields.get("total", 0)), list(fields.get("seqs", [])))
            for entry in self.store.journal_entries(key):
                if entry.outcome == "applied":
                    applied_at[int(entry.event_id.rsplit("-", 1)[1])] = entry.recorded_at
        extra = {
            "dead letters": self._dead_letters() - dead0,
            "busiest shard ev": case.busiest(ShardMap(self.bench.opts.shards).shard_for_key),
        }
        effects = check_effects(work, found)
        return SystemRun(self.name, shown, sent, applied_at, effects, cpu_s, extra, workers_cpu_s)

    def audit(self) -> str | None:
        """``keylane audit`` over everything it did: None when the lease log and the
        journal show one owner per shard, else what it found."""
        try:
            run_audit(self.bench.env)
        except BenchFailure as exc:
            return str(exc)
        return None

    def _dead_letters(self) -> int:
        return len(self.store.dead_letters(DeadLetterFilter(sources=(self.source,))))


def _envelope(case: Case, delivery: Delivery) -> bytes:
    return json.dumps(
        {
            "id": f"{case.tag}-{delivery.seq}",
            "type": event_type(case.latency_ms),
            "record_key": case.record_key(delivery.record),
            "changes": {"total": {"increment": delivery.amount}, "seqs": {"append": delivery.seq}},
        }
    ).encode()


class CelerySystem:
    """One Celery baseline: ``lock`` and ``plain`` are one prefork worker of ``processes``
    children on one queue; ``hashed`` is ``processes`` solo workers, one queue each."""

    def __init__(self, bench: Bench, kind: str, config: CeleryConfig, processes: int) -> None:
        self.bench = bench
        self.kind = kind
        self.name = f"celery-{kind}"
        self.config = config
        self.processes = processes
        self.app = create_app(config)
        self.table = table_name(self.name)
        self.redis: redis.Redis = bench.redis
        self.children: list[Child] = []

    @property
    def label(self) -> str:
        """How it was run."""
        if self.kind == "hashed":
            return f"{self.name} ({self.processes} solo workers, hashed queues)"
        lock = ", per-record Redis lock" if self.kind == "lock" else ", no lock"
        return f"{self.name} (prefork x {self.processes}{lock})"

    def cpu_now(self) -> float:
        """CPU seconds its processes have used so far."""
        return _cpu_s(self.children)

    def _queues(self) -> list[str]:
        if self.kind == "hashed":
            return [hashed_queue(n) for n in range(self.processes)]
        return [POOL_QUEUE if self.kind == "lock" else PLAIN_QUEUE]

    def start(self) -> None:
        """Start the worker(s) and wait until each queue has answered a ping."""
        table = Table(self.config.destination_url, self.table)
        table.create()
        table.close()
        env = {**self.bench.env, **self.config.env()}
        common = ["--prefetch-multiplier", "4"]
        if self.kind == "hashed":
            for n, queue in enumerate(self._queues()):
                argv = worker_argv("--pool", "solo", "-Q", queue, "-n", f"{queue}@%h", *common)
                self.children.append(self.bench.start(f"{self.name}-{n}", argv, env))
        else:
            (queue,) = self._queues()
            argv = worker_argv(
                "--pool", "prefork", "--concurrency", str(self.processes), "-Q", queue,
                "-n", f"{queue}@%h", *common,
            )  # fmt: skip
            self.children.append(self.bench.start(self.name, argv, env))

    def wait_ready(self) -> None:
        """Every queue of this system is consumed: each answered a ping task."""
        ready = f"{self.config.prefix}ready:{self.name}"
        queues = self._queues()
        for queue in queues:
            self.app.send_task(PING_TASK, args=[self.table, ready, queue], queue=queue)

        def answered() -> bool:
            if not all(c.alive() for c in self.children):
                raise BenchFailure(f"a {self.name} process exited:\n{self.bench.logs_tail()}")
            return reply_int(self.redis.hlen(ready)) == len(queues)

        wait_for(answered, 180, f"{self.name} to consume its queues", self.bench.logs_tail, 0.2)

    def run(self, case: Case) -> SystemRun:
        """Publish the case's deliveries, wait for every one to be applied, read back."""
        work = case.work
        done = self.config.done_key(case.tag + self.name)
        retries = self.config.lock_retries_key(case.tag + self.name)
        task = LOCKED_TASK if self.kind == "lock" else RMW_TASK

        def publish(delivery: Delivery) -> None:
            key = case.record_key(delivery.record)
            job: dict[str, Any] = {
                "key": key,
                "seq": delivery.seq,
                "amount": delivery.amount,
                "latency_ms": case.latency_ms,
                "delivery": delivery.index,
                "done": done,
                "retries": retries,
                "table": self.table,
            }
            queue = queue_for(key, self.processes) if self.kind == "hashed" else self._queues()[0]
            self.app.send_task(task, args=[job], queue=queue)

        cpu0 = _cpu_s(self.children)
        sent = send_all(work, SENDERS, lambda: publisher(publish))
        _wait_until(
            lambda: reply_int(self.redis.hlen(done)) >= len(work.deliveries),
            case.timeout_s(self.processes),
        )
        cpu_s = _cpu_s(self.children) - cpu0
        return self._collect(case, sent, done, retries, cpu_s)

    def _collect(self, case: Case, sent: Sent, done: str, retries: str, cpu_s: float) -> SystemRun:
        work = case.work
        applied_at: list[float | None] = [None] * work.events
        marks = cast("dict[bytes, bytes]", self.redis.hgetall(done))
        for delivery_index, at in marks.items():
            seq = work.deliveries[int(delivery_index)].seq
            first = applied_at[seq]
            applied_at[seq] = float(at) if first is None else min(first, float(at))
        table = Table(self.config.destination_url, self.table)
        try:
            prefix = case.key_prefix
            rows = table.read_prefix(prefix)
        finally:
            table.close()
        found = {int(key[len(prefix) :]): row for key, row in rows.items()}
        effects = check_effects(work, found)
        extra = {}
        if self.kind == "hashed":
            extra["busiest queue ev"] = case.busiest(lambda key: queue_for(key, self.processes))
        if self.kind == "lock":
            extra["lock retries"] = reply_int(self.redis.get(retries))
        return SystemRun(self.name, case, sent, applied_at, effects, cpu_s, extra, cpu_s)

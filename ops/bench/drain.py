"""Part (c) of the benchmark, **drain**: how fast the lanes alone apply events, with no
HTTP and no load generator competing for the CPUs.

Before any worker runs, the shard queues are filled with the workload of (b)
(:func:`keylane.ops.bench.e2e.workload`). Each event is built as the receiver builds it: the
``demo`` source's verifier and intake, :func:`keylane.producers.accept.new_event` (body hash,
``accepted_at``, shard from :class:`keylane.routing.ShardMap`) and
:func:`keylane.routing.contract.message.event_message`, pushed with ``LPUSH`` to
``RedisKeys(namespace).queue(queue_name)``, in workload order, in pipelines on one
connection, so each shard queue holds its records' events in the order they were pushed.
What the receiver's accept script does besides the push is left out: the dedupe mark (no
lane reads it), the counters, and the doorbell (no worker listens yet; a lane looks at
each shard as soon as it acquires it).

Then ``W`` workers of ``--lanes`` lanes are started, and the run is timed two ways:

* **from the moment every shard is owned** (all 64 leased, by all ``W`` workers: the
  split has settled) until the store's journal holds every event. Events already applied
  by then are left out of the rate and of the CPU per event. This is the lanes' steady
  rate: the headline number, compared with the direct baseline;
* **from worker start**: process start, Celery's boot and shard acquisition included.

Each run has its own Redis namespace and store (no leases, fences, members or journal
left over from another run), removed with its workers when the run ends. Afterwards the
store is checked as in (b) (:func:`keylane.ops.bench.e2e.check_store`): journal size, each
record's sum and revision, every event ``applied``, no dead letters, and per-record
order: the push order stands in for the HTTP answers of (b) (push ``i`` was "sent and
answered" at time ``i``), so each record's revisions must follow the order its events
were pushed. Then ``keylane audit`` runs on the run's namespace and store.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass

import redis

from ...producers.accept import body_sha256, new_event
from ...producers.formats import parse_json
from ...producers.intake import Intake, load_hook, take_in
from ...producers.signatures import verifiers_of
from ...routing import ShardMap
from ...routing.contract.message import event_message
from ...routing.contract.sources import DEMO, Sources
from ...routing.redis_keys import RedisKeys
from ...workers.store import JournalStore
from ...workers.stores import open_store
from ..deployment_view import DeploymentView
from .e2e import (
    DirectRun,
    Workload,
    apply_direct,
    check_store,
    push_order,
    workload,
)
from .phases import all_shards_owned, run_audit
from .procs import (
    SHARD_COUNT,
    Bench,
    BenchFailure,
    Child,
    fresh_store_url,
    keylane_argv,
    namespace_of,
    new_namespace,
    redis_cpu_s,
    say,
)
from .report import DrainRun, Report

#: ``LPUSH``es per pipeline while filling the queues.
FILL_BATCH = 500
#: How often the clock is read against the shard leases and the journal.
POLL_S = 0.02
HEADERS = {"content-type": "application/json"}


def run_drain_phase(bench: Bench, report: Report) -> None:
    """(c): for each key count, the direct baseline, then one drain run per worker count."""
    opts = bench.opts
    # Whatever (a) and (b) started would compete for the CPUs: stop it first.
    bench.stop_all()
    shards = ShardMap(SHARD_COUNT)
    for keys in opts.keys:
        work = workload(f"d{keys}", opts.events, keys)
        say(f"(c) keys={keys}: direct baseline")
        with fresh_store_url(opts.store, bench.tmp, opts.pg_url, f"cdirect{keys}") as url:
            direct = apply_direct(url, work, shards)
        if direct.problems:
            raise BenchFailure(f"(c) direct keys={keys}:\n  " + "\n  ".join(direct.problems))
        for workers in opts.drain_workers or (opts.workers,):
            report.drain.append(_drain_run(bench, work, workers, direct))


def receiver_messages(
    work: Workload, shards: ShardMap, start: int, stop: int
) -> list[tuple[str, bytes]]:
    """Events ``start..stop`` of ``work`` as (queue name, message), built as
    ``keylane.producers.receiver`` builds them for a delivery to ``/webhooks/demo`` (a
    body's ``also`` becomes the event's identities)."""
    verifier = verifiers_of(Sources([DEMO]), {})[DEMO.name]
    hook = load_hook(DEMO)
    out = []
    for body in work.bodies[start:stop]:
        now = time.time()
        verified = verifier.verify(HEADERS, body, now)
        intake = take_in(DEMO, verified, body, parse_json(body), HEADERS, hook)
        if not isinstance(intake, Intake):
            raise BenchFailure(f"the demo source ignored a workload body: {intake}")
        event = new_event(
            shards,
            source=DEMO.name,
            event_id=intake.event_id,
            event_type=intake.event_type,
            record_key=intake.record_key,
            changes=intake.changes,
            body_sha256=body_sha256(body),
            key_missing=intake.key_missing,
            conditions=intake.conditions,
            if_revision=intake.if_revision,
            identities=intake.identities,
        )
        out.append((event.queue, event_message(event.wire, event.queue)))
    return out


def fill_queues(client: redis.Redis, keys: RedisKeys, shards: ShardMap, work: Workload) -> int:
    """``LPUSH`` every event of ``work`` to its shard queue, in order; how many the shard
    queues hold afterwards."""
    total = len(work.bodies)
    for start in range(0, total, FILL_BATCH):
        pipe = client.pipeline(transaction=False)
        for queue, message in receiver_messages(work, shards, start, start + FILL_BATCH):
            pipe.lpush(keys.queue(queue), message)
        pipe.execute()
    pipe = client.pipeline(transaction=False)
    for queue in shards.all_queues():
        pipe.llen(keys.queue(queue))
    return sum(int(n) for n in pipe.execute())


@dataclass(frozen=True)
class _Mark:
    """The clocks at one moment of a drain run."""

    at: float  # perf_counter
    journal: int
    workers_cpu_s: float
    redis_cpu_s: float
    bench_cpu_s: float


def _mark(store: JournalStore, workers: list[Child], client: redis.Redis) -> _Mark:
    return _Mark(
        time.perf_counter(),
        store.journal_size(),
        sum(w.cpu_s() for w in workers),
        redis_cpu_s(client),
        time.process_time(),
    )


def _drain_run(bench: Bench, work: Workload, workers: int, direct: DirectRun) -> DrainRun:
    opts = bench.opts
    events, keys = len(work.bodies), work.keys
    shards = ShardMap(SHARD_COUNT)
    tag = f"(c) workers={workers} keys={keys}"
    with ExitStack() as es:
        namespace = es.enter_context(namespace_of(bench.redis, new_namespace()))
        store_url = es.enter_context(
            fresh_store_url(opts.store, bench.tmp, opts.pg_url, f"drain_w{workers}_k{keys}")
        )
        store = open_store(store_url)
        es.callback(store.close)
        store.migrate()
        redis_keys = RedisKeys(namespace)
        say(f"{tag}: filling the shard queues with {events} events")
        queued = fill_queues(bench.redis, redis_keys, shards, work)
        if queued != events:
            raise BenchFailure(f"{tag}: the shard queues hold {queued} messages, not {events}")
        env = {**bench.env, "KEYLANE_NAMESPACE": namespace, "KEYLANE_STORE_URL": store_url}
        view = DeploymentView(bench.redis, redis_keys, shards)
        say(f"{tag}: starting {workers} worker(s) x {opts.lanes} lanes")
        redis0, bench0, t0 = redis_cpu_s(bench.redis), time.process_time(), time.perf_counter()
        procs = [
            bench.start(
                f"drain-w{workers}-k{keys}-worker-{n}",
                keylane_argv("worker", "--lanes", str(opts.lanes)),
                env,
                es,
            )
            for n in range(workers)
        ]
        es.callback(_terminate, procs)  # unwinds first: they stop in parallel
        start = _Mark(t0, 0, 0.0, redis0, bench0)
        owned, done = _watch(bench, store, view, procs, events, tag)
        time.sleep(0.2)  # let a late second effect, if there were one, land before the check
        problems = check_store(store, work, events, push_order(events))
        if problems:
            raise BenchFailure(f"{tag}:\n  " + "\n  ".join(problems))
        say(f"{tag}: keylane audit")
        run_audit(env)
    return DrainRun(
        workers=workers,
        keys=keys,
        events=events,
        owned_s=None if owned is None else owned.at - start.at,
        done_s=done.at - start.at,
        applied_before_owned=events if owned is None else owned.journal,
        workers_cpu_s=None if owned is None else done.workers_cpu_s - owned.workers_cpu_s,
        redis_cpu_s=None if owned is None else done.redis_cpu_s - owned.redis_cpu_s,
        bench_cpu_s=None if owned is None else done.bench_cpu_s - owned.bench_cpu_s,
        workers_cpu_total_s=done.workers_cpu_s,
        redis_cpu_total_s=done.redis_cpu_s - start.redis_cpu_s,
        direct=direct,
    )


def _terminate(procs: list[Child]) -> None:
    for proc in procs:
        proc.terminate()


def _watch(
    bench: Bench,
    store: JournalStore,
    view: DeploymentView,
    procs: list[Child],
    events: int,
    tag: str,
) -> tuple[_Mark | None, _Mark]:
    """Poll until the journal holds ``events`` entries: the marks when every shard was
    first owned (None if the journal was full first) and when the journal was full."""
    timeout_s = max(90.0, events / 20)
    deadline = time.monotonic() + timeout_s
    owned: _Mark | None = None
    while time.monotonic() < deadline:
        if owned is None and all_shards_owned(view, bench.opts.shards, procs, bench.logs_tail):
            owned = _mark(store, procs, bench.redis)
        elif not all(p.alive() for p in procs):
            raise BenchFailure(f"{tag}: a worker exited:\n{bench.logs_tail()}")
        if store.journal_size() >= events:
            return owned, _mark(store, procs, bench.redis)
        time.sleep(POLL_S)
    raise BenchFailure(
        f"{tag}: timed out after {timeout_s:.0f}s; the journal holds "
        f"{store.journal_size()} of {events} entries\n{bench.logs_tail()}"
    )

"""Part (b) of the benchmark, end to end, run on a :class:`Bench` (its processes,
namespace and store) and written into a :class:`Report`, and the receiver it shares with
(a) (:mod:`keylane.ops.bench.receiver`); (c) is in :mod:`keylane.ops.bench.drain`."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

from ...routing import ShardMap
from ...routing.assignment import assign_shards
from ...routing.redis_keys import RedisKeys
from ...workers.stores import open_store
from ...workers.stores.sql import SqlStore
from ..deployment_view import DeploymentView
from ..embedded_redis import free_port
from .e2e import apply_direct, check_store, workload
from .load import run_load
from .procs import (
    REPO,
    SHARD_COUNT,
    Bench,
    BenchFailure,
    Child,
    fresh_store_url,
    keylane_argv,
    redis_cpu_s,
    say,
    wait_for,
)
from .report import E2eRun, Report


def start_receiver(bench: Bench) -> tuple[Child, str]:
    """The run's receiver (started on first use) and its URL."""
    if bench.receiver is None:
        port = free_port()
        bench.receiver = bench.start(
            "receiver", keylane_argv("serve", "--port", str(port), "--ops-port", "0")
        )
        bench.receiver_url = f"http://127.0.0.1:{port}"
        bench.wait_http(bench.receiver, f"{bench.receiver_url}/readyz")
    return bench.receiver, bench.receiver_url


def start_workers(bench: Bench) -> list[Child]:
    """Start ``--workers`` workers of ``--lanes`` lanes; wait until every shard is owned."""
    opts = bench.opts
    workers = [
        bench.start(f"worker-{n}", keylane_argv("worker", "--lanes", str(opts.lanes)))
        for n in range(opts.workers)
    ]
    say(f"(b) starting {opts.workers} worker(s) x {opts.lanes} lanes")
    wait_owned(bench, workers)
    return workers


def wait_owned(bench: Bench, workers: list[Child]) -> None:
    """Wait until every shard is owned by ``workers`` as the balanced split gives them."""
    view = DeploymentView(bench.redis, RedisKeys(bench.namespace), ShardMap(bench.opts.shards))
    wait_for(
        lambda: all_shards_owned(view, bench.opts.shards, workers, bench.logs_tail),
        90,
        "every shard to be owned by the workers",
        bench.logs_tail,
        0.2,
    )


def all_shards_owned(
    view: DeploymentView, shards: int, workers: list[Child], logs_tail: Callable[[], str]
) -> bool:
    """Every shard is owned, each by the one of ``workers`` the balanced split gives it
    to (the split has settled); :class:`BenchFailure` if a worker has exited."""
    if not all(w.alive() for w in workers):
        raise BenchFailure(f"a worker exited:\n{logs_tail()}")
    owner_of = {shard: h.rsplit("/", 1)[0] for shard, h in view.lease_values().items()}
    owners = set(owner_of.values())
    if len(owner_of) != shards or len(owners) != min(len(workers), shards):
        return False
    split = assign_shards(shards, owners)
    return all(owner_of[shard] == owner for owner, mine in split.items() for shard in mine)


def run_e2e_phase(bench: Bench, report: Report) -> None:
    """(b): for each key count, post the workload and wait until it is applied; then
    check the store exactly and measure the direct baseline."""
    receiver, url = start_receiver(bench)
    workers = start_workers(bench)
    store = open_store(bench.store_url)
    bench.es.callback(store.close)
    store.migrate()
    for keys in bench.opts.keys:
        report.e2e.append(_e2e_run(bench, store, receiver, workers, url, keys))
    say("(b) keylane audit")
    run_audit(bench.env)


def run_audit(env: dict[str, str]) -> None:
    """``keylane audit`` with ``env`` (its namespace and store): the lease log and the
    journal show one owner per shard."""
    result = subprocess.run(
        keylane_argv("audit", "--json"),
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise BenchFailure(
            f"keylane audit exited {result.returncode}:\n{result.stdout[-3000:]}"
            f"{result.stderr[-2000:]}"
        )


def _e2e_run(
    bench: Bench, store: SqlStore, receiver: Child, workers: list[Child], url: str, keys: int
) -> E2eRun:
    opts = bench.opts
    work = workload(f"k{keys}", opts.events, keys)
    expected = store.journal_size() + opts.events
    receiver0, workers0 = receiver.cpu_s(), sum(w.cpu_s() for w in workers)
    redis0 = redis_cpu_s(bench.redis)
    say(f"(b) keys={keys}: {opts.events} events")
    load = run_load(f"{url}/webhooks/demo", work.bodies, opts.concurrency, retry=True)
    unanswered = opts.events - load.statuses[202] - load.statuses[200]
    if unanswered:
        raise BenchFailure(
            f"keys={keys}: {unanswered} of {opts.events} deliveries were never accepted "
            f"(answers {dict(load.statuses)}, transport errors {load.transport_errors})"
        )
    done_at = wait_for(
        lambda: store.journal_size() >= expected,
        max(60.0, opts.events / 20),
        f"{expected} journal entries",
        lambda: f"journal holds {store.journal_size()}\n{bench.logs_tail()}",
        0.02,
    )
    receiver_s = receiver.cpu_s() - receiver0
    workers_s = sum(w.cpu_s() for w in workers) - workers0
    redis_s = redis_cpu_s(bench.redis) - redis0
    time.sleep(0.2)  # let a late second effect, if there were one, land before the check
    problems = check_store(store, work, expected, load.spans)
    if problems:
        raise BenchFailure(f"keys={keys}:\n  " + "\n  ".join(problems))
    say(f"(b) keys={keys}: direct baseline")
    with fresh_store_url(opts.store, bench.tmp, opts.pg_url, f"direct{keys}") as direct_url:
        direct = apply_direct(direct_url, work, ShardMap(SHARD_COUNT))
    if direct.problems:
        raise BenchFailure(f"direct keys={keys}:\n  " + "\n  ".join(direct.problems))
    done_s = done_at - load.first_post_at
    return E2eRun(keys, opts.events, load, done_s, receiver_s, workers_s, redis_s, direct)

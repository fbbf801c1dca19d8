"""The same end-to-end workload on the Redis broker and on a RabbitMQ cluster, side by side.

    ops/dev python -m keylane.ops.bench.brokers --broker-url amqp://u:p@h1:5672,h2:5672,h3:5672/ \
        --events 3000 --keys 64 --workers 2 --senders 16

Each run starts a receiver and ``--workers`` worker processes on a fresh PostgreSQL schema
and namespace, POSTs the workload's increments (``--senders`` concurrent clients, a 503
retried with the same body), and measures the receiver's accept rate (202 per second) and
the end-to-end rate (events applied per second, from the first POST until the journal
holds them all). Then it checks the invariants as ``keylane.ops.bench`` does: every event
applied exactly once (each record's sum and revision) and in order per record (a delivery
answered before another of its record was sent has the lower revision). Exit 1 when one
does not hold. Redis runs first (the default broker), RabbitMQ second.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from ...routing.contract.settings import load_settings, settings_environ
from ...workers.brokers.rabbitmq import delete_topology
from ...workers.stores import open_store
from .e2e import check_store, workload
from .load import run_load
from .procs import (
    BenchFailure,
    child,
    child_env,
    delete_namespace,
    fresh_store_url,
    keylane_argv,
    new_namespace,
    wait_for,
)

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True)
class BrokerRun:
    """What one run measured."""

    broker: str
    events: int
    accepted_per_s: float
    applied_per_s: float
    p50_ms: float
    p99_ms: float
    refused: int
    problems: list[str]


def run_one(broker_url: str | None, opts: argparse.Namespace, tmp: Path, port: int) -> BrokerRun:
    """One run of the workload on ``broker_url`` (None: Redis)."""
    name = "rabbitmq" if broker_url else "redis"
    namespace = new_namespace()
    work = workload(f"{name}-{namespace[-6:]}", opts.events, opts.keys)
    with contextlib.ExitStack() as es:
        store_url = es.enter_context(fresh_store_url("postgres", tmp, opts.pg_url, name))
        settings = load_settings(
            data_dir=tmp / name,
            redis_url=opts.redis_url,
            store_url=store_url,
            namespace=namespace,
            broker_url=broker_url,
            port=port,
            # One event per write: a record's revision then counts its events exactly.
            batch_max=1,
            log_level="WARNING",
            shard_high_water=1_000_000,
            global_high_water=100_000_000,
        )
        env = child_env(settings_environ(settings))
        client = redis.Redis.from_url(opts.redis_url)
        es.callback(client.close)
        es.callback(delete_namespace, client, namespace)
        if broker_url:
            es.callback(delete_topology, settings)
        store = open_store(store_url)
        es.callback(store.close)
        store.migrate()
        logs = tmp / name
        logs.mkdir(parents=True, exist_ok=True)
        receiver = es.enter_context(child("receiver", keylane_argv("serve"), env, logs))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _ready(url), 60, "the receiver", receiver.log_tail)
        for n in range(opts.workers):
            argv = keylane_argv("worker", "--lanes", str(opts.lanes))
            es.enter_context(child(f"worker-{n}", argv, env, logs))
        time.sleep(opts.settle_s)  # workers join and take their shards
        started = time.perf_counter()
        load = run_load(f"{url}/webhooks/demo", work.bodies, opts.senders, retry=True)
        wait_for(
            lambda: store.journal_size() >= load.accepted,
            600,
            "every accepted event applied",
            lambda: f"journal {store.journal_size()} of {load.accepted}",
            interval_s=0.2,
        )
        elapsed = time.perf_counter() - started
        problems = check_store(store, work, opts.events, load.spans)
        if load.accepted != opts.events:
            problems.append(f"{load.accepted} of {opts.events} accepted")
    return BrokerRun(
        name,
        opts.events,
        load.accepted_per_s,
        load.accepted / elapsed,
        load.percentile_ms(50),
        load.percentile_ms(99),
        sum(n for status, n in load.statuses.items() if status != 202),
        problems,
    )


def _ready(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main(argv: list[str] | None = None) -> int:
    """Run the workload on Redis, then on RabbitMQ; print one table; 1 if an invariant
    failed."""
    parser = argparse.ArgumentParser(prog="python -m keylane.ops.bench.brokers")
    parser.add_argument("--broker-url", required=True, help="amqp://... of a RabbitMQ cluster")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS)
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lanes", type=int, default=64)
    parser.add_argument("--senders", type=int, default=16)
    parser.add_argument("--port", type=int, default=18090)
    parser.add_argument("--settle-s", type=float, default=5.0)
    opts = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory(prefix="klbench-brokers-") as tmp:
        for n, broker_url in enumerate((None, opts.broker_url)):
            try:
                runs.append(run_one(broker_url, opts, Path(tmp), opts.port + n))
            except BenchFailure as exc:
                print(f"failed: {exc}", file=sys.stderr)
                return 1
    print("| broker | events | accepted/s | p50 / p99 ms | applied/s (end to end) | invariants |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        verdict = "OK" if not r.problems else "; ".join(r.problems[:3])
        print(
            f"| {r.broker} | {r.events} | {r.accepted_per_s:,.0f} | {r.p50_ms:.1f} / "
            f"{r.p99_ms:.1f} | {r.applied_per_s:,.0f} | {verdict} |"
        )
    return 1 if any(r.problems for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The same end-to-end workload on the Redis broker and on a RabbitMQ cluster, side by side.

    ops/dev python -m keylane.ops.bench.brokers --broker-url amqp://u:p@h1:5672,h2:5672,h3:5672/ \
        --events 3000 --keys 64 --receivers 2 --workers 2 --senders 16

First, one receiver alone (no worker) under ``wrk`` for ``--wrk-s`` seconds on each broker:
what one receiver process accepts per second. Then each run starts ``--receivers``
receivers (the senders spread over them) and ``--workers`` worker processes on a fresh
PostgreSQL schema and namespace, waits until the workers have split the shards, POSTs the
workload's increments (``--senders`` concurrent clients, a 503 retried with the same
body), and measures the accept rate (202 per second) and the end-to-end rate (events
applied per second, from the first POST until the journal holds them all). Then it checks
the invariants as ``keylane.ops.bench`` does: every event applied exactly once (each
record's sum and revision) and in order per record (a delivery answered before another of
its record was sent has the lower revision).
Exit 1 when one does not hold. Redis runs first (the default broker), RabbitMQ second.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from ...routing.contract.settings import Settings
from ...routing.contract.settings_env import load_settings, settings_environ
from ...workers.brokers.rabbitmq import delete_topology
from ...workers.stores import open_store
from ...workers.stores.sql import SqlStore
from ..views import open_view
from .e2e import check_store, workload
from .load import run_load
from .phases import all_shards_owned
from .procs import (
    BenchFailure,
    Child,
    child,
    child_env,
    cpu_s_by_command,
    delete_namespace,
    fresh_store_url,
    keylane_argv,
    machine_busy_s,
    new_namespace,
    wait_for,
)
from .wrk import WrkResult, ensure_wrk, run_wrk

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
    #: CPU seconds per role during the run (receivers, workers, the load generator, each
    #: server by command name, the rest of the machine).
    cpu_s: dict[str, float]


@dataclass(frozen=True)
class Deployment:
    """A fresh namespace and PostgreSQL schema with its receivers running."""

    settings: Settings
    env: dict[str, str]  # the processes' environment
    logs: Path
    store: SqlStore
    urls: list[str]  # the receivers' webhook URLs
    receivers: list[Child]


@contextlib.contextmanager
def deployment(
    broker_url: str | None, opts: argparse.Namespace, tmp: Path, port: int, receivers: int
) -> Iterator[Deployment]:
    """A fresh namespace and PostgreSQL schema on ``broker_url`` (None: Redis) with
    ``receivers`` receivers on ports from ``port``, ready. Cleaned up after."""
    name = "rabbitmq" if broker_url else "redis"
    namespace = new_namespace()
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
        logs = tmp / f"{name}-{namespace[-6:]}"
        logs.mkdir(parents=True, exist_ok=True)
        urls, started = [], []
        for n in range(receivers):
            argv = keylane_argv("serve", "--port", str(port + n), "--ops-port", "0")
            receiver = es.enter_context(child(f"receiver-{n}", argv, env, logs))
            url = f"http://127.0.0.1:{port + n}"
            wait_for(functools.partial(_ready, url), 60, "the receiver", receiver.log_tail)
            urls.append(f"{url}/webhooks/demo")
            started.append(receiver)
        yield Deployment(settings, env, logs, store, urls, started)


@dataclass(frozen=True)
class AcceptRun:
    """One receiver alone under wrk: what it accepted, and the CPU that cost."""

    broker: str
    wrk: WrkResult
    receiver_cpu_s: float
    machine_cpu_s: float  # every process on the machine, wrk included

    def per_event_ms(self, cpu_s: float) -> float:
        """``cpu_s`` per accepted event, in ms."""
        return cpu_s * 1000 / max(1, self.wrk.answered_2xx)


def accept_only(
    broker_url: str | None, opts: argparse.Namespace, tmp: Path, port: int
) -> AcceptRun:
    """One receiver alone (no worker) under wrk for ``--wrk-s`` seconds: what one receiver
    process accepts per second on ``broker_url`` (None: Redis), and the CPU it and the
    rest of the machine (the broker's nodes, Redis) spent."""
    with deployment(broker_url, opts, tmp, port, 1) as dep:
        wrk = ensure_wrk()
        tag = "warm-" + new_namespace()[-6:]
        run_wrk(wrk, dep.urls[0], tag, opts.wrk_connections, 2)
        receiver0, machine0 = dep.receivers[0].cpu_s(), machine_busy_s()
        measured = run_wrk(wrk, dep.urls[0], tag + "x", opts.wrk_connections, opts.wrk_s)
        receiver_s = dep.receivers[0].cpu_s() - receiver0
        machine_s = machine_busy_s() - machine0
    return AcceptRun("rabbitmq" if broker_url else "redis", measured, receiver_s, machine_s)


def run_one(broker_url: str | None, opts: argparse.Namespace, tmp: Path, port: int) -> BrokerRun:
    """One run of the workload on ``broker_url`` (None: Redis)."""
    name = "rabbitmq" if broker_url else "redis"
    work = workload(f"{name}-{new_namespace()[-6:]}", opts.events, opts.keys)
    with contextlib.ExitStack() as es:
        dep = es.enter_context(deployment(broker_url, opts, tmp, port, opts.receivers))
        store = dep.store
        argv = keylane_argv("worker", "--lanes", str(opts.lanes))
        workers = [
            es.enter_context(child(f"worker-{n}", argv, dep.env, dep.logs))
            for n in range(opts.workers)
        ]
        # The load starts once the workers have split the shards: a handover under load
        # gives back what the previous owner held, measured as redeliveries.
        logs_tail = functools.partial(_logs_tail, workers)
        wait_for(
            lambda: _split(dep.settings, workers, logs_tail),
            120,
            "the workers to split the shards",
            logs_tail,
            interval_s=0.5,
        )
        roles = {"receivers": dep.receivers, "workers": workers}
        cpu0 = _cpu_by_role(roles)
        started = time.perf_counter()
        load = run_load(dep.urls, work.bodies, opts.senders, retry=True)
        wait_for(
            lambda: store.journal_size() >= load.accepted,
            600,
            "every accepted event applied",
            lambda: f"journal {store.journal_size()} of {load.accepted}",
            interval_s=0.2,
        )
        elapsed = time.perf_counter() - started
        cpu1 = _cpu_by_role(roles)
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
        {role: cpu1[role] - cpu0[role] for role in cpu0},
    )


#: Servers whose CPU the end-to-end run reports by command name.
SERVERS = ("beam.smp", "postgres", "redis-server")


def _cpu_by_role(roles: dict[str, list[Child]]) -> dict[str, float]:
    """CPU seconds used so far by each role: keylane's processes, the load generator (this
    process), each server, and the machine as a whole."""
    out = {role: sum(c.tree_cpu_s() for c in children) for role, children in roles.items()}
    out["load generator"] = time.process_time()
    out.update(cpu_s_by_command(SERVERS))
    out["machine"] = machine_busy_s()
    return out


def _split(settings: Settings, workers: list[Child], logs_tail: Callable[[], str]) -> bool:
    """Whether ``workers`` have split the shards, in a new view (a view on RabbitMQ reads
    the members' beats once)."""
    with contextlib.closing(open_view(settings)) as view:
        return all_shards_owned(view, settings.shard_count, workers, logs_tail)


def _logs_tail(children: list[Child]) -> str:
    return "\n".join(f"== {c.name}\n{c.log_tail()}" for c in children)


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
    parser.add_argument("--receivers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--lanes", type=int, default=64)
    parser.add_argument("--senders", type=int, default=16)
    parser.add_argument("--port", type=int, default=18090)
    parser.add_argument(
        "--wrk-s", type=int, default=10, help="seconds of wrk against one receiver alone (0: none)"
    )
    parser.add_argument("--wrk-connections", type=int, default=64)
    opts = parser.parse_args(argv)
    runs = []
    accepts: list[AcceptRun] = []
    brokers = (None, opts.broker_url)
    with tempfile.TemporaryDirectory(prefix="klbench-brokers-") as tmp:
        for n, broker_url in enumerate(brokers):
            port = opts.port + n * (opts.receivers + 1)
            try:
                if opts.wrk_s > 0:
                    accepts.append(accept_only(broker_url, opts, Path(tmp), port + opts.receivers))
                runs.append(run_one(broker_url, opts, Path(tmp), port))
            except BenchFailure as exc:
                print(f"failed: {exc}", file=sys.stderr)
                return 1
    if accepts:
        print(f"One receiver alone under wrk -t1 -c{opts.wrk_connections} -d{opts.wrk_s}s:")
        print(
            "| broker | accepted/s | p50 / p99 ms | not 2xx | receiver CPU ms/event "
            "| rest of the machine CPU ms/event (broker, Redis; not wrk) |"
        )
        print("|---|---|---|---|---|---|")
        for a in accepts:
            w = a.wrk
            rest_s = a.machine_cpu_s - a.receiver_cpu_s - w.client_cpu_s
            print(
                f"| {a.broker} | {w.answered_2xx / w.elapsed_s:,.0f} | {w.p50_ms:.1f} / "
                f"{w.p99_ms:.1f} | {w.status_errors + w.socket_errors} | "
                f"{a.per_event_ms(a.receiver_cpu_s):.3f} | {a.per_event_ms(rest_s):.3f} |"
            )
        print()
    print(
        f"The workload end to end: {opts.receivers} receiver(s), {opts.workers} worker(s), "
        f"{opts.senders} senders:"
    )
    print("| broker | events | accepted/s | p50 / p99 ms | applied/s (end to end) | invariants |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        verdict = "OK" if not r.problems else "; ".join(r.problems[:3])
        print(
            f"| {r.broker} | {r.events} | {r.accepted_per_s:,.0f} | {r.p50_ms:.1f} / "
            f"{r.p99_ms:.1f} | {r.applied_per_s:,.0f} | {verdict} |"
        )
    print()
    print("CPU per event during the end-to-end run (ms; all processes of a role together):")
    roles = [role for role in runs[0].cpu_s if role != "machine"]
    print(f"| broker | {' | '.join(roles)} | rest | whole machine |")
    print("|---" * (len(roles) + 3) + "|")
    for r in runs:
        per = {role: r.cpu_s[role] * 1000 / r.events for role in r.cpu_s}
        rest = per["machine"] - sum(per[role] for role in roles)
        cells = " | ".join(f"{per[role]:.3f}" for role in roles)
        print(f"| {r.broker} | {cells} | {rest:.3f} | {per['machine']:.3f} |")
    print()
    print(own_cpu_line(runs))
    return 1 if any(r.problems for r in runs) else 0


def own_cpu_line(runs: list[BrokerRun]) -> str:
    """keylane's own CPU per event (receivers and workers together) on each broker, the
    RabbitMQ run's as a ratio of the Redis run's, with the broker's nodes apart."""

    def per_event_ms(run: BrokerRun, *roles: str) -> float:
        return sum(run.cpu_s.get(role, 0.0) for role in roles) * 1000 / run.events

    own = {r.broker: per_event_ms(r, "receivers", "workers") for r in runs}
    nodes = {r.broker: per_event_ms(r, "beam.smp") for r in runs}
    line = "keylane's own CPU per event (receivers + workers): " + ", ".join(
        f"{broker} {ms:.3f} ms" for broker, ms in own.items()
    )
    if own.get("redis") and "rabbitmq" in own:
        line += f" = {own['rabbitmq'] / own['redis']:.2f}x Redis mode's"
    if "rabbitmq" in nodes:
        line += f"; the RabbitMQ nodes apart: {nodes['rabbitmq']:.3f} ms"
    return line


if __name__ == "__main__":
    raise SystemExit(main())

"""keylane against the Celery setups people build instead: ``python -m keylane.ops.bench.versus``.

The same workloads, at the same destination latency, with the same number of processes
and the same 32 sender threads, are given in one invocation to:

* **keylane**: ``keylane serve`` and ``--workers`` ``keylane worker`` processes of
  ``--lanes`` lanes (default: 1 worker on SQLite, which takes one writer process, 2 on
  PostgreSQL; never more processes than the baselines have); an ``async def`` source
  handler (:mod:`keylane.ops.bench.versus_handler`) awaits the latency between the
  lane's read and the change it returns, which the lane writes only if the record is
  unchanged;
* **celery-lock**: a prefork pool of ``processes`` children on one queue, taking a
  per-record Redis lock (``SET NX PX`` with a token, compare-and-delete release; a task
  that finds the record locked retries with a countdown);
* **celery-hashed**: ``processes`` solo workers, events routed to queue
  ``hash(key) % processes``;
* **celery-plain** (only when asked for): the pool without a lock.

Every event is a read-modify-write of its record (read, wait the latency, write ``total +
amount`` and ``seqs + [seq]``): keylane in its own store, the baselines in one table in a
store of the same kind (:mod:`keylane.ops.bench.versus_dest`). Each record's events are
sent in order by one sender thread, each after the previous one was accepted (the 2xx
answer, or the return of ``send_task``). Afterwards the records say exactly how many
units were lost, how many events were applied out of order and how many more than once
(:mod:`keylane.ops.bench.versus_work`).

For each workload and latency it prints applied events/s, accept->applied p50/p99, lost
units, reordered and double effects, and elapsed time as a multiple of two bounds: the
critical path (the hottest record's events x the latency: no system that keeps a
record's order can do better) and the larger of that and every event's wait spread over
the processes. Exit code 1 if keylane lost, reordered or doubled an event or did not
finish; the baselines' results are reported, not judged.

Runs under a private Redis namespace (keylane's, and one for the Celery app's keys and
locks), a private store and a private destination table (a SQLite file, or PostgreSQL
schemas that are dropped); every process it starts is stopped by its pid.
"""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from typing import Any

import click

from ...routing.contract.settings import DEFAULT_LANES
from .procs import (
    INTERRUPTS,
    SHARD_COUNT,
    Bench,
    BenchFailure,
    BenchOptions,
    fresh_store_url,
    namespace_of,
    new_namespace,
    say,
    worker_processes,
)
from .versus_celery import CeleryConfig
from .versus_report import json_line, render_case
from .versus_systems import Case, CelerySystem, KeylaneSystem, SystemRun
from .versus_work import WORKLOADS, make_workload

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"

HELP = """Benchmark keylane against two Celery setups, on the same workloads, the same
destination latency, the same number of processes and the same 32 sender threads.

\b
keylane        keylane serve + --workers keylane worker processes of --lanes lanes; an
               async source handler awaits the latency between the lane's read and
               its write
keylane-batch  the same processes, another source: a lane takes a record's waiting
               events together and its batch handler awaits the latency once for them
celery-lock    a prefork pool on one queue; per-record Redis lock (SET NX PX token,
               compare-and-delete release); a locked record: retry with a countdown
celery-hashed  solo workers, one queue each, events routed by hash(key) % processes
celery-plain   (only if asked for) the prefork pool without a lock

Every event reads its record, waits the latency, and writes total + amount and
seqs + [seq]. Afterwards the records show exactly the lost units, the events applied
out of order and those applied twice. One table per workload and latency: applied
events/s, accept->applied p50/p99, lost, reordered, double, and the elapsed time as
a multiple of the critical-path bound (the hottest record's events x the latency)
and of the larger of that and all events' waits spread over the processes.

Exit code 1 if keylane lost, reordered or doubled an event, or did not finish.
Private Redis namespaces, store and tables, all removed; every process it starts
is stopped.
"""
SYSTEMS = ("keylane", "keylane-batch", "celery-lock", "celery-hashed", "celery-plain")
DEFAULT_SYSTEMS = "keylane,keylane-batch,celery-lock,celery-hashed"
#: --quick: every workload at 20 ms with this many events.
QUICK_EVENTS = 600


def _choices(allowed: tuple[str, ...]) -> Any:
    def parse(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
        wrong = [n for n in names if n not in allowed]
        if wrong or not names:
            raise click.BadParameter(f"a comma-separated list of {', '.join(allowed)}")
        return names

    return parse


def _latencies(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        values = tuple(dict.fromkeys(int(v) for v in value.split(",") if v.strip()))
    except ValueError:
        values = ()
    if not values or min(values) < 0 or max(values) > 5000:
        raise click.BadParameter("a comma-separated list of milliseconds (0..5000)")
    return values


def _load(values: tuple[float, ...]) -> str:
    return " / ".join(f"{v:.1f}" for v in values)


def _run(
    system: KeylaneSystem | CelerySystem, case: Case, started: list[KeylaneSystem | CelerySystem]
) -> SystemRun:
    """``system.run(case)``, with what the other systems' idle processes used meanwhile."""
    others = [s for s in started if s.children is not system.children]
    before = sum(s.cpu_now() for s in others)
    run = system.run(case)
    run.others_cpu_s = sum(s.cpu_now() for s in others) - before
    say(
        f"  {run.applied} applied; {run.cpu_s:.1f} CPU s; "
        f"the other systems, idle, used {run.others_cpu_s:.1f} CPU s"
    )
    return run


def run_versus(
    opts: BenchOptions,
    workloads: tuple[str, ...],
    latencies: tuple[int, ...],
    systems: tuple[str, ...],
    processes: int,
    lock: tuple[int, int],
) -> int:
    """Start every system, run every case on each, print the tables; the exit code."""
    runs: list[SystemRun] = []
    audit_failure: str | None = None
    with INTERRUPTS.installed(), ExitStack() as es:
        bench = Bench(opts, es)
        load_before = os.getloadavg()
        celery_ns = es.enter_context(namespace_of(bench.redis, new_namespace() + "-celery"))
        dest_url = es.enter_context(fresh_store_url(opts.store, bench.tmp, opts.pg_url, "dest"))
        config = CeleryConfig(opts.redis_url, f"{celery_ns}:", dest_url, lock[0], lock[1])
        started: list[KeylaneSystem | CelerySystem] = []
        try:
            for name in systems:
                if name == "keylane":
                    started.append(KeylaneSystem(bench, opts.workers, opts.lanes))
                elif name == "keylane-batch":  # on keylane's processes (listed before it)
                    owner = next(s for s in started if isinstance(s, KeylaneSystem))
                    started.append(KeylaneSystem(bench, opts.workers, opts.lanes, owner))
                else:
                    kind = name.removeprefix("celery-")
                    started.append(CelerySystem(bench, kind, config, processes))
            for system in started:
                say(f"starting {system.label}")
                system.start()
            for system in started:
                if isinstance(system, CelerySystem):
                    system.wait_ready()
            cases = [
                Case(make_workload(w, opts.events), latency, f"{w[:2]}{latency}")
                for w in workloads
                for latency in latencies
            ]
            for case in cases:
                for system in started:
                    say(f"{case.work.name} @ {case.latency_ms} ms: {system.label}")
                    runs.append(_run(system, case, started))
                click.echo(render_case(case, runs[-len(started) :], processes) + "\n")
            audit = [s.audit() for s in started if isinstance(s, KeylaneSystem)]
            audit_failure = next((a for a in audit if a is not None), None)
            if audit:
                click.echo(f"keylane audit (one owner per shard): {audit_failure or 'OK'}")
        finally:
            say("stopping every process started; removing namespaces, stores and files")
            bench.terminate_all()
        options = {
            "store": opts.store,
            "events": opts.events,
            "processes": processes,
            "workers": opts.workers,
            "lanes": opts.lanes,
            "lock_ttl_ms": lock[0],
            "lock_retry_ms": lock[1],
            "load_before": load_before,
            "load_after": os.getloadavg(),
        }
        click.echo(
            f"load average (1/5/15 min) before {_load(load_before)}, after {_load(os.getloadavg())}"
            f" on {os.cpu_count()} CPUs; rerun on a quiet machine for absolute figures"
        )
        click.echo(json_line(runs, processes, options))
    broken = [
        r
        for r in runs
        if r.system.startswith("keylane")
        and (not r.effects.clean or r.applied < r.case.work.events)
    ]
    for run in broken:
        click.echo(
            f"FAILED: {run.system} on {run.case.work.name} @ {run.case.latency_ms} ms: "
            f"{run.effects} applied {run.applied}/{run.case.work.events}",
            err=True,
        )
    return 1 if broken or audit_failure else 0


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, help=HELP)
@click.option(
    "--workload",
    "workloads",
    default=",".join(WORKLOADS),
    show_default=True,
    callback=_choices(WORKLOADS),
    help="wide: >= 1,000 records; skewed: Zipf over 10 records; storm: every event 3 times.",
)
@click.option(
    "--latency-ms",
    "latencies",
    default="20,200",
    show_default=True,
    callback=_latencies,
    help="Destination latency between each event's read and its write.",
)
@click.option(
    "--events",
    type=click.IntRange(10),
    default=3000,
    show_default=True,
    help="Events per workload (storm sends each 3 times).",
)
@click.option(
    "--processes",
    type=click.IntRange(1, 64),
    default=8,
    show_default=True,
    help="Worker processes of each Celery baseline (keylane never runs more).",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=None,
    help="keylane worker processes  [default: 1 on SQLite, 2 on PostgreSQL]",
)
@click.option(
    "--lanes",
    type=click.IntRange(1, 1024),
    default=DEFAULT_LANES,
    show_default=True,
    help="Lanes (records in flight) per keylane worker process (KEYLANE_LANES).",
)
@click.option(
    "--shards",
    type=click.IntRange(1, 4096),
    default=SHARD_COUNT,
    show_default=True,
    help="keylane's shards (KEYLANE_SHARD_COUNT): the unit of ownership; records in "
    "flight are bounded by --lanes, not by this.",
)
@click.option(
    "--systems",
    default=DEFAULT_SYSTEMS,
    show_default=True,
    callback=_choices(SYSTEMS),
    help=f"Any of {', '.join(SYSTEMS)}.",
)
@click.option(
    "--store",
    type=click.Choice(["sqlite", "postgres"]),
    default="sqlite",
    show_default=True,
    help="keylane's store and the baselines' table: a SQLite file, or PostgreSQL schemas.",
)
@click.option("--redis-url", default="redis://127.0.0.1:6379/0", show_default=True)
@click.option("--pg-url", default=DEFAULT_PG_URL, show_default=True, envvar="KEYLANE_TEST_PG_URL")
@click.option("--lock-ttl-ms", type=click.IntRange(1), default=10_000, show_default=True)
@click.option(
    "--lock-retry-ms",
    type=click.IntRange(1),
    default=50,
    show_default=True,
    help="Countdown of a task that found its record locked (x 0.5..1.5 at random).",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Smoke test: every workload, 20 ms, 600 events (overrides those options).",
)
@click.option("--keep-temp", is_flag=True, help="Keep the temporary directory (logs, SQLite).")
def main(
    workloads: tuple[str, ...],
    latencies: tuple[int, ...],
    events: int,
    processes: int,
    workers: int | None,
    lanes: int,
    shards: int,
    systems: tuple[str, ...],
    store: str,
    redis_url: str,
    pg_url: str,
    lock_ttl_ms: int,
    lock_retry_ms: int,
    quick: bool,
    keep_temp: bool,
) -> None:
    """Entry point (see the module docstring)."""
    workers = worker_processes(store, workers)
    if workers > processes:
        raise click.BadParameter(
            f"{workers} keylane workers would be more processes than the baselines' {processes}",
            param_hint="--workers",
        )
    if "keylane-batch" in systems and "keylane" not in systems:
        systems = ("keylane", *systems)  # keylane-batch runs on keylane's processes
    systems = tuple(sorted(systems, key=SYSTEMS.index))
    if quick:
        workloads, latencies, events = WORKLOADS, (20,), QUICK_EVENTS
    opts = BenchOptions(
        store=store,
        redis_url=redis_url,
        pg_url=pg_url,
        events=events,
        concurrency=32,
        keys=(),
        workers=workers,
        lanes=lanes,
        shards=shards,
        rounds=1,
        only=None,
        keep_temp=keep_temp,
    )
    try:
        lock = (lock_ttl_ms, lock_retry_ms)
        code = run_versus(opts, workloads, latencies, systems, processes, lock)
    except BenchFailure as exc:
        click.echo(f"versus: {exc}", err=True)
        code = 1
    except KeyboardInterrupt:
        click.echo("versus: interrupted; everything it started was stopped", err=True)
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()

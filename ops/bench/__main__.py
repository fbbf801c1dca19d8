"""keylane's benchmark: ``python -m keylane.ops.bench``.

(a) **Receiver** (:mod:`keylane.ops.bench.receiver`): requests per second, p50/p99
    latency and server CPU per request of ``keylane serve`` under ``wrk -t1
    -c<--concurrency> -d<--duration>s`` (new event ids, each ``--body`` kind;
    :mod:`keylane.ops.bench.wrk`), against a baseline served the same way
    (:mod:`keylane.ops.bench.baseline`: parse the body, ``LPUSH``, nothing else) and,
    with ``--against REV``, that revision's ``keylane serve``
    (:mod:`keylane.ops.bench.trees`), taking turns round by round; every 2xx is checked
    against the accept script's count and the shard queues.
(b) **End to end**: for each ``--keys`` count, events per second from the first POST
    until the store's journal holds every event, with ``--workers`` worker processes of
    ``--lanes`` lanes, against a baseline that applies the same events in this process
    with a lane's read, change and conditional write on a fresh store of the same kind.
    Afterwards the store is checked exactly: journal size, each record's sum and revision,
    per-record order, no dead letters. Any difference fails the run (exit code 1).
(c) **Drain** (:mod:`keylane.ops.bench.drain`): the lanes alone. For each ``--keys`` count and
    each ``--drain-workers`` count (default ``--workers``), the shard queues are filled
    with the same workload without HTTP, messages built as the receiver builds them;
    then the workers start, and events per second are measured from the moment every
    shard is owned (and from worker start) until the journal holds every event, with
    workers' and Redis's CPU per event, against the same direct baseline, and checked
    as in (b) (the push order standing in for the HTTP answers).
(d) **Trickle** (:mod:`keylane.ops.bench.trickle`): events arriving one at a time, no
    backlog. One receiver and one worker at their defaults on a Redis server of the run's
    own; the idle cost, then per ``--rates`` rate, ``--seconds`` of events paced one at a
    time over the largest ``--keys`` count: Redis commands per event (``INFO
    commandstats``), by name, and CPU ms per event of receiver, worker and Redis with the
    idle cost subtracted; then journal size, sums and no dead letters are checked.

Everything runs under a private Redis namespace ``klbench-<hex>`` (its keys are deleted
at the end; nothing else is touched) and a private store (a SQLite file in a temporary
directory, or a PostgreSQL schema that is dropped). Every process started is stopped.
"""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from dataclasses import asdict

import click

from .procs import INTERRUPTS, BenchFailure, BenchOptions, say, worker_processes
from .trickle_report import Pace

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
MAX_WORKERS = 64

HELP = """Benchmark keylane on this machine, each part against a baseline measured in the
same run.

\b
(a) receiver: requests per second, p50/p99 latency and server CPU per request of
    `keylane serve` under wrk (installed with apt-get when absent), for each --body
    kind, against a bare Starlette app served the same way that parses the body and
    LPUSHes it and, with --against REV, against the receiver of that git revision;
    every server once a round, --rounds rounds.
(b) end to end: events per second from the first POST until the store journal
    holds them all, once per --keys count, against a lane's read, change and write
    in one thread on a fresh store; then journal size, sums, revisions and
    per-record order are checked.
(c) drain: the lanes alone. The shard queues are filled without HTTP, then
    --drain-workers worker processes (default --workers) start; events per second
    from the moment every shard is owned (and from worker start) until the journal
    holds them all, once per --keys and worker count, against the same baseline;
    checked as (b), with the push order as the order to keep.
(d) trickle: one receiver and one worker at their defaults on a Redis server of their
    own; the idle cost, then for each --rates rate --seconds of events sent one at a
    time over the largest --keys count: Redis commands per event, by command, and CPU
    ms per event by process, less the idle cost; journal size and sums checked.

Runs under a private Redis namespace (klbench-<hex>) and store, both removed at the
end; stops every process it starts. Exit code 1 if an invariant does not hold.
"""


def run_bench(opts: BenchOptions, pace: Pace | None = None) -> int:
    """Run the benchmark, print the table and the JSON line; the exit code. ``pace``:
    (d)'s rates and seconds (default: :class:`Pace`'s)."""
    from .drain import run_drain_phase
    from .phases import run_e2e_phase
    from .procs import Bench, redis_profile
    from .receiver import run_receiver_phase
    from .report import Report
    from .trickle import run_trickle_phase

    with INTERRUPTS.installed(), ExitStack() as es:
        bench = Bench(opts, es)
        report = Report(
            options={
                k: v
                for k, v in asdict(opts).items()
                if k not in ("redis_url", "pg_url", "keep_temp")
            },
            redis=redis_profile(bench.redis),
            load_before=os.getloadavg(),
        )
        failure: BenchFailure | None = None
        try:
            if opts.only in (None, "receiver"):
                run_receiver_phase(bench, report)
                report.invariants = "OK"
            if opts.only in (None, "e2e"):
                run_e2e_phase(bench, report)
                report.invariants = "OK"
            if opts.only in (None, "drain"):
                run_drain_phase(bench, report)
                report.invariants = "OK"
            if opts.only in (None, "trickle"):
                report.trickle = run_trickle_phase(opts, es, pace or Pace())
                report.invariants = "OK"
        except BenchFailure as exc:
            failure = exc
            report.invariants = "FAILED"
        finally:
            say("stopping every process started; removing the namespace and temporary files")
            bench.terminate_all()
        report.load_after = os.getloadavg()
        click.echo(report.render())
        click.echo(report.json_line())
        if failure is not None:
            click.echo(f"\nFAILED: {failure}", err=True)
            return 1
    return 0


def _kinds(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    """A comma-separated list of body kinds, duplicates dropped."""
    from .bodies import KINDS

    kinds = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    if not kinds or not set(kinds) <= set(KINDS):
        raise click.BadParameter(f"a comma-separated list of {', '.join(KINDS)}")
    return kinds


def _counts(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    """A comma-separated list of positive integers, duplicates dropped; empty stays empty
    only for an option whose default is empty."""
    try:
        counts = tuple(dict.fromkeys(int(v) for v in value.split(",") if v.strip()))
    except ValueError:
        raise click.BadParameter("a comma-separated list of positive integers") from None
    if (not counts and param.default) or (counts and min(counts) < 1):
        raise click.BadParameter("a comma-separated list of positive integers")
    if param.name == "drain_workers" and counts and max(counts) > MAX_WORKERS:
        raise click.BadParameter(f"at most {MAX_WORKERS} workers")
    return counts


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, help=HELP)
@click.option(
    "--store",
    type=click.Choice(["sqlite", "postgres"]),
    default="sqlite",
    show_default=True,
    help="Store kind: a SQLite file in a temporary directory, or a PostgreSQL schema.",
)
@click.option("--redis-url", default="redis://127.0.0.1:6379/0", show_default=True)
@click.option(
    "--pg-url",
    default=DEFAULT_PG_URL,
    show_default=True,
    envvar="KEYLANE_TEST_PG_URL",
    help="PostgreSQL server for --store postgres (a schema is created and dropped).",
)
@click.option(
    "--events",
    type=click.IntRange(1),
    default=500,
    show_default=True,
    help="Events per (b) and (c) run.",
)
@click.option(
    "--duration",
    "duration_s",
    type=click.IntRange(1, 600),
    default=15,
    show_default=True,
    help="Seconds of wrk load per (a) round and server.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1024),
    default=32,
    show_default=True,
    help="Concurrent HTTP clients (one keep-alive connection each); wrk's -c in (a).",
)
@click.option(
    "--keys",
    default="1,8,64,1000",
    show_default=True,
    callback=_counts,
    help="Distinct record keys for (b) and (c); a comma-separated list runs each once per count.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, MAX_WORKERS),
    default=None,
    help="Worker processes for (b), and for (c) without --drain-workers.  "
    "[default: 1 on SQLite, which takes one writer process; 2 on PostgreSQL]",
)
@click.option(
    "--drain-workers",
    default="",
    callback=_counts,
    help="Worker counts for (c), comma-separated (e.g. 1,2): each runs once per --keys "
    "count.  [default: --workers]",
)
@click.option(
    "--lanes",
    type=click.IntRange(1, 256),
    default=4,
    show_default=True,
    help="Lanes per worker process.",
)
@click.option(
    "--rounds",
    type=click.IntRange(1, 20),
    default=2,
    show_default=True,
    help="(a) runs every server and body kind once a round, this many rounds; each round "
    "is shown, with the spread and the round-by-round ratios.",
)
@click.option(
    "--body",
    "bodies",
    default="json",
    show_default=True,
    callback=_kinds,
    help="(a)'s body kinds, comma-separated, each measured every round: json, form, "
    "multipart, xml (one event, read by one mapped source) or envelope (keylane's own, "
    "the demo source).",
)
@click.option(
    "--against",
    metavar="REV",
    default=None,
    help="(a) also serves the receiver of this git revision (e.g. 44bfee1, v0.1.0), "
    "installed from its own lock into a venv cached by commit under "
    "$TMPDIR/keylane-bench-trees, taking turns with this tree's round by round.",
)
@click.option(
    "--rates",
    default="10,50,200",
    show_default=True,
    callback=_counts,
    help="(d)'s rates, events per second, comma-separated: each runs --seconds.",
)
@click.option(
    "--seconds",
    type=click.FloatRange(0.5, 600),
    default=20.0,
    show_default=True,
    help="Seconds of events per (d) rate.",
)
@click.option(
    "--only",
    type=click.Choice(["receiver", "e2e", "drain", "trickle"]),
    default=None,
    help="Run only one part.",
)
@click.option(
    "--profile",
    is_flag=True,
    help="End (a) with one more keylane round under py-spy (pip install py-spy), not "
    "counted in the figures, and show where the receiver's time goes.",
)
@click.option("--keep-temp", is_flag=True, help="Keep the temporary directory (logs, SQLite).")
def main(
    store: str,
    redis_url: str,
    pg_url: str,
    events: int,
    duration_s: int,
    concurrency: int,
    keys: tuple[int, ...],
    workers: int | None,
    drain_workers: tuple[int, ...],
    lanes: int,
    rounds: int,
    bodies: tuple[str, ...],
    against: str | None,
    rates: tuple[int, ...],
    seconds: float,
    only: str | None,
    profile: bool,
    keep_temp: bool,
) -> None:
    """Entry point (see the module docstring)."""
    workers = worker_processes(store, workers, *drain_workers)
    opts = BenchOptions(
        store,
        redis_url,
        pg_url,
        events,
        concurrency,
        keys,
        workers,
        lanes,
        rounds,
        only,
        keep_temp,
        drain_workers,
        duration_s=duration_s,
        profile=profile,
        against=against,
        bodies=bodies,
    )
    try:
        code = run_bench(opts, Pace(tuple(float(r) for r in rates), seconds))
    except BenchFailure as exc:
        click.echo(f"bench: {exc}", err=True)
        code = 1
    except KeyboardInterrupt:
        click.echo("bench: interrupted; everything it started was stopped", err=True)
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()

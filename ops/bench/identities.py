"""What claiming identities costs the lanes: ``python -m keylane.ops.bench.identities``.

The lanes drain a backlog as in part (c) of the benchmark (:mod:`keylane.ops.bench.drain`):
the shard queues are filled with every event before any worker runs (messages built as
the receiver builds them for ``/webhooks/demo``), then one worker of ``--lanes`` lanes is
started, and the run is timed from the moment every shard is owned until the store's
journal holds every event. Two variants of the same ``--events`` increments over
``--keys`` records (:func:`keylane.ops.bench.e2e.workload`) alternate in one run,
``--rounds`` times each (baseline first):

* **baseline**: keylane's envelope, no identities;
* **identities**: the same events, each naming two identities of its record in ``also``
  (``email:r<n>@example.com``, ``phone:+1555<n, 7 digits>``), distinct per record. A lane
  claims them in the write's transaction and, after the commit, reads the identity index
  for other records they name; none ever does, so no merge is proposed: this measures the
  claim and the owners' lookup, not merges.

For each run: events applied per second and the worker's CPU per event, over the window
(from worker start when the journal filled before every shard was owned); on PostgreSQL
also the CPU of every ``postgres`` process on the machine per event, from worker start to
done. Then the median of each variant and the ratio identities / baseline of each figure.

After each run the store is checked (exit code 1 otherwise): the journal holds every event,
each record's sum and revision are exact and its events were applied in push order, no
dead letters; for the identities variant the index holds exactly two identities per
record, each naming its record. Each run has its own Redis namespace and store (a SQLite
file, or a PostgreSQL schema), removed when it ends; every process started is stopped.
Not part of the wheel (``ops/bench``).
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import click

from ...routing import ShardMap
from ...routing.contract.settings import DEFAULT_LANES
from ...routing.redis_keys import RedisKeys
from ...workers.store import IdentityStore, StoreConnection
from ...workers.stores import open_store
from ...workers.stores.postgres import PostgresDialect
from ...workers.stores.sql import SqlStore
from ..deployment_view import DeploymentView
from .drain import _terminate, _watch, fill_queues
from .e2e import Workload, check_store, push_order, workload
from .procs import (
    INTERRUPTS,
    SHARD_COUNT,
    Bench,
    BenchFailure,
    BenchOptions,
    cpu_s_by_command,
    cpu_s_of,
    fresh_store_url,
    keylane_argv,
    namespace_of,
    new_namespace,
    say,
)

VARIANTS = ("baseline", "identities")
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
#: Below this share of the events in the owned-to-done window, a run is timed from worker
#: start instead (as :attr:`keylane.ops.bench.report.DrainRun.steady`).
STEADY_SHARE = 0.1


def identities_of(record: int) -> tuple[str, str]:
    """The two identities of record number ``record``, in their normal form."""
    return f"email:r{record}@example.com", f"phone:+1555{record:07d}"


def with_identities(work: Workload) -> Workload:
    """``work``'s events, each naming its record's two identities in ``also``."""
    index = {key: n for n, key in enumerate(dict.fromkeys(work.record_keys))}
    bodies = []
    for body, key in zip(work.bodies, work.record_keys, strict=True):
        doc = json.loads(body)
        doc["also"] = list(identities_of(index[key]))
        bodies.append(json.dumps(doc).encode())
    return replace(work, bodies=bodies)


def expected_index(work: Workload) -> dict[str, str]:
    """Identity -> the record it must name, once ``with_identities(work)`` is applied."""
    out: dict[str, str] = {}
    for n, key in enumerate(dict.fromkeys(work.record_keys)):
        for identity in identities_of(n):
            out[identity] = key
    return out


def check_index(store: IdentityStore, expected: dict[str, str]) -> list[str]:
    """Every way the store's identity index differs from ``expected`` (empty when it
    holds exactly those identities, each naming its record)."""
    problems: list[str] = []
    if isinstance(store, SqlStore):  # the whole index, not only what names these records
        with store.dialect.cursor() as cur:
            cur.execute("SELECT identity, record_key FROM identities")
            held = {str(row[0]): str(row[1]) for row in cur.fetchall()}
        if len(held) != len(expected):
            problems.append(f"the identity index holds {len(held)}, expected {len(expected)}")
        problems += [f"{i}: names {held[i]}" for i in held.keys() - expected.keys()][:5]
    owners = store.identity_owners(list(expected))
    for identity, key in expected.items():
        if owners.get(identity) != key:
            problems.append(f"{identity}: names {owners.get(identity)}, expected {key}")
    by_record: dict[str, list[str]] = {}
    for identity, key in expected.items():
        by_record.setdefault(key, []).append(identity)
    for key, mine in by_record.items():
        found = store.identities_of(key)
        if sorted(found) != sorted(mine):
            problems.append(f"{key}: named by {found}, expected {sorted(mine)}")
    return problems[:20]


# -- one run -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One drain of the backlog: the events and clocks of its timed window."""

    variant: str
    round: int
    events: int
    #: Events applied in the window, and its length: from every shard owned to done
    #: (from worker start when :attr:`from_start`).
    window_events: int
    window_s: float
    workers_cpu_s: float
    #: Every ``postgres`` process's CPU from worker start to done (None on SQLite).
    store_cpu_s: float | None = None
    from_start: bool = False

    @property
    def per_s(self) -> float:
        """Events applied per second in the window."""
        return self.window_events / self.window_s if self.window_s > 0 else 0.0

    @property
    def cpu_ms(self) -> float:
        """The worker's CPU ms per event in the window."""
        return self.workers_cpu_s * 1000 / max(1, self.window_events)

    @property
    def store_ms(self) -> float | None:
        """The store server's CPU ms per event, from worker start (PostgreSQL only)."""
        return None if self.store_cpu_s is None else self.store_cpu_s * 1000 / self.events


def _postgres_cpu_s(store: StoreConnection) -> float | None:
    """CPU seconds used so far by every ``postgres`` process on this machine but the
    backend of ``store``'s own connection (this process's polling of the journal); None
    when ``store`` is not on PostgreSQL."""
    if not (isinstance(store, SqlStore) and isinstance(store.dialect, PostgresDialect)):
        return None
    with store.dialect.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        poller = int(cur.fetchone()[0])
    return cpu_s_by_command(["postgres"])["postgres"] - cpu_s_of(poller)


@contextmanager
def _sqlite_removed(store_url: str, keep: bool) -> Iterator[None]:
    """On exit, the SQLite file of ``store_url`` and its journal files are removed
    (unless ``keep``): each run's store goes with it, not with the whole run."""
    try:
        yield
    finally:
        if store_url.startswith("sqlite:///") and not keep:
            path = Path(store_url[len("sqlite:///") :])
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)


def drain_once(bench: Bench, work: Workload, variant: str, round_no: int) -> Run:
    """Fill a fresh namespace's shard queues with ``work``, start one worker, time the
    drain, check the store; everything the run made is removed when it returns."""
    opts = bench.opts
    events = len(work.bodies)
    shards = ShardMap(opts.shards)
    tag = f"round {round_no} {variant}"
    sent = with_identities(work) if variant == "identities" else work
    with ExitStack() as es:
        namespace = es.enter_context(namespace_of(bench.redis, new_namespace()))
        name = f"ids_{variant[:4]}_{round_no}"
        store_url = es.enter_context(fresh_store_url(opts.store, bench.tmp, opts.pg_url, name))
        es.enter_context(_sqlite_removed(store_url, opts.keep_temp))
        store = open_store(store_url)
        es.callback(store.close)
        store.migrate()
        redis_keys = RedisKeys(namespace)
        say(f"{tag}: filling the shard queues with {events} events")
        queued = fill_queues(bench.redis, redis_keys, shards, sent)
        if queued != events:
            raise BenchFailure(f"{tag}: the shard queues hold {queued} messages, not {events}")
        env = {**bench.env, "KEYLANE_NAMESPACE": namespace, "KEYLANE_STORE_URL": store_url}
        view = DeploymentView(bench.redis, redis_keys, shards)
        say(f"{tag}: starting 1 worker x {opts.lanes} lanes")
        pg0 = _postgres_cpu_s(store)
        t0 = time.perf_counter()
        argv = keylane_argv("worker", "--lanes", str(opts.lanes))
        procs = [bench.start(f"{name}-worker", argv, env, es)]
        es.callback(_terminate, procs)
        owned, done = _watch(bench, store, view, procs, events, tag)
        pg1 = _postgres_cpu_s(store)
        store_cpu_s = None if pg0 is None or pg1 is None else pg1 - pg0
        if owned is not None and (events - owned.journal) >= STEADY_SHARE * events:
            window = (events - owned.journal, done.at - owned.at)
            run = Run(variant, round_no, events, *window, done.workers_cpu_s - owned.workers_cpu_s)
        else:
            run = Run(variant, round_no, events, events, done.at - t0, done.workers_cpu_s)
            run = replace(run, from_start=True)
        run = replace(run, store_cpu_s=store_cpu_s)
        time.sleep(0.2)  # let a late second effect, if there were one, land before the check
        problems = check_store(store, work, events, push_order(events))
        if variant == "identities":
            problems += check_index(store, expected_index(work))
        if problems:
            raise BenchFailure(f"{tag}:\n  " + "\n  ".join(problems))
    say(f"{tag}: {run.per_s:,.0f} events/s, {run.cpu_ms:.3f} worker CPU ms/event")
    return run


# -- the report --------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """What to measure, and where."""

    store: str
    redis_url: str
    pg_url: str
    events: int
    keys: int
    rounds: int
    lanes: int
    keep_temp: bool = False


def command_line(opts: Options) -> str:
    """The command that reproduces the run."""
    argv = ["python", "-m", "keylane.ops.bench.identities", "--store", opts.store]
    argv += ["--events", str(opts.events), "--keys", str(opts.keys)]
    argv += ["--rounds", str(opts.rounds), "--lanes", str(opts.lanes)]
    return shlex.join(argv)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render(opts: Options, runs: list[Run], load: tuple[float, float]) -> str:
    """The runs, the medians of each variant and their ratios, and the command."""
    pg = opts.store == "postgres"
    store_col = f"{'PG CPU MS/EVENT':>17}" if pg else ""
    lines = [
        f"== identities against baseline: {opts.store}, 1 worker x {opts.lanes} lanes, "
        f"{opts.events:,} events over {opts.keys:,} records, {opts.rounds} round(s)",
        f"load average {load[0]:.1f} before, {load[1]:.1f} after, on {os.cpu_count()} CPUs",
        "each run: the shard queues filled (demo envelope, an increment each), then 1 worker "
        "started; timed from every shard owned until the journal holds every event",
        "identities: each event names 2 of its record's (email:r<n>@example.com, "
        "phone:+1555<n>), distinct per record: claimed with the write, owners read after it, "
        "no merge",
    ]
    if pg:
        lines.append(
            "PG CPU: every postgres process on this machine but this bench's polling "
            "connection, from worker start to done, per event"
        )
    lines += [
        "(runs) in the order they ran",
        f"{'ROUND':<7}{'VARIANT':<12}{'EVENTS/S':>10}{'WORKER CPU MS/EVENT':>21}{store_col}"
        f"{'TIMED EVENTS':>14}{'TIMED S':>9}",
    ]
    for run in runs:
        timed = f"{run.window_events:,}" + ("*" if run.from_start else "")
        store = f"{_ms(run.store_ms):>17}" if pg else ""
        lines.append(
            f"{run.round:<7}{run.variant:<12}{run.per_s:>10,.0f}{run.cpu_ms:>21.3f}{store}"
            f"{timed:>14}{run.window_s:>9.2f}"
        )
    if any(r.from_start for r in runs):
        lines.append("* the journal filled before every shard was owned: timed from worker start")
    medians: dict[str, tuple[float | None, float | None, float | None]] = {}
    for variant in VARIANTS:
        mine = [r for r in runs if r.variant == variant]
        medians[variant] = (
            _median([r.per_s for r in mine]),
            _median([r.cpu_ms for r in mine]),
            _median([r.store_ms for r in mine]),
        )
    lines += [
        "(medians) of each variant's runs",
        f"{'VARIANT':<12}{'RUNS':>5}{'EVENTS/S':>10}{'WORKER CPU MS/EVENT':>21}{store_col}",
    ]
    for variant in VARIANTS:
        per_s, cpu, store_ms = medians[variant]
        count = sum(1 for r in runs if r.variant == variant)
        store = f"{_ms(store_ms):>17}" if pg else ""
        rate = "-" if per_s is None else f"{per_s:,.0f}"
        lines.append(f"{variant:<12}{count:>5}{rate:>10}{_ms(cpu):>21}{store}")
    (b_rate, b_cpu, b_store), (i_rate, i_cpu, i_store) = medians["baseline"], medians["identities"]
    ratio = (
        f"identities / baseline (medians): events/s {_ratio(i_rate, b_rate)}, "
        f"worker CPU ms/event {_ratio(i_cpu, b_cpu)}"
    )
    if pg:
        ratio += f", postgres CPU ms/event {_ratio(i_store, b_store)}"
    lines += [
        ratio,
        f"checked after each run: journal {opts.events:,} entries, each record's sum and "
        "revision exact and in push order, no dead letters; identities runs: the index holds "
        f"exactly {2 * opts.keys:,} identities, each naming its record",
        f"reproduce: {command_line(opts)}",
    ]
    return "\n".join(lines)


def run(opts: Options) -> str:
    """Every round of both variants, alternating; the printed report."""
    load0 = os.getloadavg()[0]
    work = workload("ids", opts.events, opts.keys)
    bench_opts = BenchOptions(
        opts.store,
        opts.redis_url,
        opts.pg_url,
        events=opts.events,
        concurrency=1,
        keys=(opts.keys,),
        workers=1,
        lanes=opts.lanes,
        rounds=opts.rounds,
        only=None,
        keep_temp=opts.keep_temp,
        shards=SHARD_COUNT,
    )
    runs: list[Run] = []
    with INTERRUPTS.installed(), ExitStack() as es:
        bench = Bench(bench_opts, es)
        es.callback(bench.terminate_all)
        for round_no in range(1, opts.rounds + 1):
            for variant in VARIANTS:
                runs.append(drain_once(bench, work, variant, round_no))
        say("stopping every process started; removing the namespaces and temporary files")
    return render(opts, runs, (load0, os.getloadavg()[0]))


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, help=__doc__)
@click.option("--store", type=click.Choice(["sqlite", "postgres"]), default="sqlite")
@click.option("--redis-url", default="redis://127.0.0.1:6379/0", show_default=True)
@click.option("--pg-url", default=DEFAULT_PG_URL, envvar="KEYLANE_TEST_PG_URL", show_default=True)
@click.option("--events", type=click.IntRange(1), default=20_000, show_default=True)
@click.option("--keys", type=click.IntRange(1), default=2_000, show_default=True)
@click.option(
    "--rounds",
    type=click.IntRange(1, 20),
    default=3,
    show_default=True,
    help="Runs of each variant, alternating.",
)
@click.option(
    "--lanes",
    type=click.IntRange(1, 1024),
    default=DEFAULT_LANES,
    show_default=True,
    help="Lanes of the worker (default: the worker's own default).",
)
@click.option("--keep-temp", is_flag=True, help="Keep the temporary directory (logs, SQLite).")
def main(
    store: str,
    redis_url: str,
    pg_url: str,
    events: int,
    keys: int,
    rounds: int,
    lanes: int,
    keep_temp: bool,
) -> None:
    """Entry point (see the module docstring)."""
    if keys > events:
        raise click.UsageError("--keys must not exceed --events: each record needs an event")
    opts = Options(store, redis_url, pg_url, events, keys, rounds, lanes, keep_temp)
    try:
        click.echo(run(opts))
    except BenchFailure as exc:
        click.echo(f"bench: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("bench: interrupted; everything it started was stopped", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()

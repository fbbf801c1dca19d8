"""Part (d) of the benchmark, a trickle: events arriving one at a time, no backlog (the
usual CRM and form traffic), and what each costs in Redis commands and in CPU.

One receiver and ONE worker, every setting at its default, on a Redis server of the
run's own (``redis-server`` on a free port, as ``keylane up`` embeds it: append-only,
``appendfsync always``), so ``INFO commandstats``, which counts the whole server's
commands, counts only keylane's. Once every shard is owned, the idle cost is measured
(commands per second by command, CPU per second of receiver, worker and Redis); then for
each ``--rates`` rate, ``rate x --seconds`` events are sent one at a time over the keys,
each answered 202 before the next goes (:func:`keylane.ops.bench.load.run_paced`), and
measured from the first send until the journal holds them all (and one second more, for
the acknowledgements after the last commit). Per event: Redis commands (all, and less
the idle ones for as long), the commands by name, and CPU by process less the idle cost.
Afterwards the store must hold each event once: journal size, each record's sum, no
dead letters.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import redis

from ...routing.contract.errors import ConfigError
from ...workers.stores import open_store
from ...workers.stores.sql import SqlStore
from ..embedded_redis import EmbeddedRedis
from .e2e import Workload, check_journal, workload
from .load import run_paced
from .phases import start_receiver, wait_owned
from .procs import (
    INTERRUPTS,
    Bench,
    BenchFailure,
    BenchOptions,
    Child,
    cpu_s_of,
    keylane_argv,
    redis_profile,
    say,
    wait_for,
)
from .trickle_report import ROLES, Pace, TrickleResults, TrickleRun, Usage

#: Settings the other parts pin that a trickle leaves at their defaults.
PINNED = (
    "KEYLANE_BATCH_MAX",
    "KEYLANE_SHARD_HIGH_WATER",
    "KEYLANE_GLOBAL_HIGH_WATER",
    "KEYLANE_MAX_ATTEMPTS",
)
#: Seconds after every shard is owned before the idle window (start-up's rings settle).
SETTLE_S = 2.0
#: Seconds after the journal is full that a run's window goes on (the last finishes).
TAIL_S = 1.0
#: Commands the benchmark itself sends to the server while it measures.
OWN_COMMANDS = frozenset({"info"})


@dataclass(frozen=True)
class Sample:
    """The counters at one instant."""

    at: float
    commands: Counter[str]
    cpu_s: dict[str, float]


class Meter:
    """Reads the server's commands by name and the CPU of the three processes."""

    def __init__(self, client: redis.Redis, server_pid: int, procs: dict[str, Child]) -> None:
        self.client = client
        self.server_pid = server_pid
        self.procs = procs

    def sample(self) -> Sample:
        """The counters now."""
        stats: Any = self.client.info("commandstats")  # (an Awaitable too before redis-py 8)
        commands: Counter[str] = Counter()
        for name, values in stats.items():
            command = str(name).removeprefix("cmdstat_")
            if command not in OWN_COMMANDS:
                commands[command] = int(values["calls"])
        cpu = {role: proc.tree_cpu_s() for role, proc in self.procs.items()}
        cpu["redis"] = cpu_s_of(self.server_pid)
        return Sample(time.perf_counter(), commands, cpu)


def usage(before: Sample, after: Sample) -> Usage:
    """What was used between two samples."""
    commands = Counter(after.commands)
    commands.subtract(before.commands)
    return Usage(
        seconds=after.at - before.at,
        commands=+commands,
        cpu_s={role: after.cpu_s[role] - before.cpu_s[role] for role in ROLES},
    )


def own_redis(es: ExitStack) -> EmbeddedRedis:
    """A Redis server of the run's own, stopped and removed when ``es`` unwinds."""
    tmp = Path(tempfile.mkdtemp(prefix="klbench-redis-"))
    es.callback(shutil.rmtree, tmp, True)
    server = EmbeddedRedis(tmp)
    with INTERRUPTS.critical():
        try:
            server.start()
        except ConfigError as exc:
            raise BenchFailure(f"cannot start a Redis server for the trickle: {exc}") from exc
        finally:
            es.callback(server.stop)
    return server


def run_trickle_phase(opts: BenchOptions, es: ExitStack, pace: Pace) -> TrickleResults:
    """(d): the idle cost, then each rate's trickle, measured and checked."""
    rates, seconds = pace.rates, pace.seconds
    server = own_redis(es)
    bench = Bench(replace(opts, redis_url=server.url), es)
    bench.env = {k: v for k, v in bench.env.items() if k not in PINNED}
    keys = max(opts.keys)
    results = TrickleResults(
        store=opts.store, keys=keys, seconds=seconds, redis=redis_profile(bench.redis)
    )
    try:
        meter, store = _start(bench, server)
        idle_s = min(10.0, max(2.0, seconds))
        say(f"(d) trickle: idle for {idle_s:.0f}s")
        first = meter.sample()
        time.sleep(idle_s)
        results.idle = usage(first, meter.sample())
        for rate in rates:
            results.runs.append(_trickle(bench, meter, store, rate, seconds, keys))
        results.invariants = "OK"
    finally:
        bench.terminate_all()
    return results


def _start(bench: Bench, server: EmbeddedRedis) -> tuple[Meter, SqlStore]:
    """Start the receiver and the one worker; wait until every shard is owned."""
    receiver, _url = start_receiver(bench)
    worker = bench.start("trickle-worker", keylane_argv("worker"))
    say("(d) trickle: waiting until the worker owns every shard")
    wait_owned(bench, [worker])
    store = open_store(bench.store_url)
    bench.es.callback(store.close)
    store.migrate()
    time.sleep(SETTLE_S)
    assert server.process is not None
    return Meter(bench.redis, server.process.pid, {"receiver": receiver, "worker": worker}), store


def _trickle(
    bench: Bench, meter: Meter, store: SqlStore, rate: float, seconds: float, keys: int
) -> TrickleRun:
    events = max(1, round(rate * seconds))
    work = workload(f"t{rate:g}", events, keys)
    expected = store.journal_size() + events
    say(f"(d) trickle: {events} events at {rate:g}/s over {keys} keys")
    before = meter.sample()
    load = run_paced(f"{bench.receiver_url}/webhooks/demo", work.bodies, rate)
    if load.accepted != events:
        raise BenchFailure(
            f"trickle at {rate:g}/s: {load.accepted} of {events} answered 202 "
            f"(answers {dict(load.statuses)}, transport errors {load.transport_errors})"
        )
    wait_for(
        lambda: store.journal_size() >= expected,
        60 + events / 10,
        f"{expected} journal entries",
        lambda: f"journal holds {store.journal_size()}\n{bench.logs_tail()}",
        0.02,
    )
    time.sleep(TAIL_S)
    window = usage(before, meter.sample())
    problems = check_trickle(store, work, expected)
    if problems:
        raise BenchFailure(f"trickle at {rate:g}/s:\n  " + "\n  ".join(problems))
    return TrickleRun(rate, events, events / load.elapsed_s, load.percentile_ms(99), window)


def check_trickle(store: SqlStore, work: Workload, journal_expected: int) -> list[str]:
    """How the store differs from ``work`` applied exactly once (empty when it does not):
    the journal's size, dead letters, each record's sum. Revisions are not compared: at
    the defaults a record's waiting events may be written together."""
    problems = check_journal(store, journal_expected)
    for key, (total, _count) in work.totals().items():
        found = store.read(key).fields.get("n")
        if found != total:
            problems.append(f"{key}: n={found}, expected {total}")
    return problems[:20]

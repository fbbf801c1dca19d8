"""Memory over a long run: ``python -m keylane.ops.bench.soak --events 1000000``.

One ``keylane serve`` and ``--workers`` ``keylane worker`` processes (``--lanes`` lanes
each) take ``--events`` webhooks over HTTP from ``--concurrency`` keep-alive clients: unique
event ids, increments over ``--keys`` records, sent in ``--samples`` equal chunks. After
each chunk it prints the events sent and applied so far, the resident memory (RSS) of the
receiver and of the workers (each process with its children), and Redis's
``used_memory``. Resident memory that grows with events, after the first chunks have
warmed the caches, is a leak: the journal grows on disk by design, and Redis by the event
ids it remembers for dedupe (their retention, three days by default).

At the end every event must be in the journal exactly once and every record must hold
the sum of its increments (exit code 1 otherwise); then it reports what Redis spends per
remembered event id, two ways: ``used_memory`` grown over the run divided by the events
(all in: the ids' hashes, the told outcomes of the last hour, the expiry and the hash
tables' share), and ``MEMORY USAGE`` per id of a sample of the hashes of remembered ids
(``RedisKeys.seen_ids``).

Runs under a private Redis namespace and store, both removed at the end; stops every
process it starts.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import redis

from ...routing.contract.replies import reply_int
from ...routing.redis_keys import RedisKeys
from ...workers.store import JournalStore
from ...workers.stores import open_store
from ...workers.stores.sql import SqlStore
from .load import run_load
from .phases import start_receiver, start_workers
from .procs import (
    INTERRUPTS,
    Bench,
    BenchFailure,
    BenchOptions,
    Child,
    descendants,
    say,
    wait_for,
    worker_processes,
)

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
#: Dedupe keys whose MEMORY USAGE is averaged.
MEMORY_SAMPLE = 2000


@dataclass(frozen=True)
class Sample:
    """The deployment after one chunk."""

    sent: int
    applied: int
    elapsed_s: float
    receiver_mib: float
    workers_mib: float
    redis_mib: float


def rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants, in MiB (0 for one that is gone)."""
    total_kib = 0
    for one in [pid, *descendants(pid)]:
        try:
            status = Path(f"/proc/{one}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total_kib += int(line.split()[1])
    return total_kib / 1024


def used_memory(client: redis.Redis) -> int:
    """Redis's ``used_memory``, in bytes."""
    memory: Any = client.info("memory")
    return int(memory["used_memory"])


def bodies(start: int, count: int, keys: int) -> list[bytes]:
    """Events ``start`` .. ``start + count - 1``: event i adds ``increment(i)`` to field
    ``n`` of record ``soak:<i % keys>``."""
    return [
        json.dumps(
            {
                "id": f"soak-{i}",
                "type": "bench.increment",
                "record_key": f"soak:{i % keys}",
                "changes": {"n": {"increment": increment(i)}},
            }
        ).encode()
        for i in range(start, start + count)
    ]


def increment(i: int) -> int:
    """What event ``i`` adds."""
    return (i * 7919) % 13 + 1


def check(store: SqlStore, events: int, keys: int) -> list[str]:
    """How the store differs from every event applied exactly once."""
    problems = []
    size = store.journal_size()
    if size != events:
        problems.append(f"journal holds {size} entries, expected {events}")
    totals = [0] * keys
    for i in range(events):
        totals[i % keys] += increment(i)
    for key, total in enumerate(totals):
        if total == 0:
            continue
        record = store.read(f"soak:{key}")
        if record.fields.get("n") != total:
            problems.append(f"soak:{key}: n={record.fields.get('n')}, expected {total}")
    return problems[:20]


def dedupe_key_bytes(client: redis.Redis, keys: RedisKeys) -> float:
    """``MEMORY USAGE`` per remembered id of up to :data:`MEMORY_SAMPLE` of the run's
    hashes of remembered ids (``RedisKeys.seen_ids``, every source)."""
    size, ids = 0, 0
    for n, key in enumerate(client.scan_iter(match=f"{keys.prefix}seen-ids:*", count=1000)):
        size += reply_int(client.memory_usage(key, samples=0))
        ids += reply_int(client.hlen(key))
        if n + 1 >= MEMORY_SAMPLE:
            break
    return size / ids if ids else 0.0


def soak(bench: Bench, samples: int, keys: int) -> list[Sample]:
    """Send the events in ``samples`` chunks, one sample after each; then wait for and
    check the journal. Raises :class:`BenchFailure` when an invariant does not hold."""
    opts = bench.opts
    receiver, url = start_receiver(bench)
    workers = start_workers(bench)
    store = open_store(bench.store_url)
    bench.es.callback(store.close)
    store.migrate()
    chunk = -(-opts.events // samples)
    started = time.perf_counter()
    out = [_sample(bench, store, receiver, workers, 0, started)]
    _print(out[0], header=True)
    sent = 0
    while sent < opts.events:
        count = min(chunk, opts.events - sent)
        load = run_load(
            f"{url}/webhooks/demo", bodies(sent, count, keys), opts.concurrency, retry=True
        )
        unanswered = count - load.statuses[202] - load.statuses[200]
        if unanswered:
            raise BenchFailure(
                f"{unanswered} of events {sent}..{sent + count - 1} were never accepted "
                f"(answers {dict(load.statuses)}, transport errors {load.transport_errors})"
            )
        sent += count
        out.append(_sample(bench, store, receiver, workers, sent, started))
        _print(out[-1])
    wait_for(
        lambda: store.journal_size() >= opts.events,
        max(120.0, opts.events / 100),
        f"{opts.events} journal entries",
        lambda: f"journal holds {store.journal_size()}\n{bench.logs_tail()}",
        0.5,
    )
    out.append(_sample(bench, store, receiver, workers, sent, started))
    _print(out[-1])
    problems = check(store, opts.events, keys)
    if problems:
        raise BenchFailure("\n  ".join(["the store differs:", *problems]))
    return out


def _sample(
    bench: Bench, store: JournalStore, receiver: Child, workers: list[Child], sent: int, t0: float
) -> Sample:
    return Sample(
        sent=sent,
        applied=store.journal_size(),
        elapsed_s=time.perf_counter() - t0,
        receiver_mib=rss_mib(receiver.pid),
        workers_mib=sum(rss_mib(w.pid) for w in workers),
        redis_mib=used_memory(bench.redis) / 2**20,
    )


def _print(sample: Sample, header: bool = False) -> None:
    if header:
        click.echo(
            f"{'SENT':>9} {'APPLIED':>9} {'ELAPSED S':>9} {'RECEIVER MIB':>12} "
            f"{'WORKERS MIB':>11} {'REDIS MIB':>9}"
        )
    click.echo(
        f"{sample.sent:>9} {sample.applied:>9} {sample.elapsed_s:>9.0f} "
        f"{sample.receiver_mib:>12.1f} {sample.workers_mib:>11.1f} {sample.redis_mib:>9.1f}"
    )


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--events", type=click.IntRange(1), default=1_000_000, show_default=True)
@click.option(
    "--keys",
    type=click.IntRange(1),
    default=10_000,
    show_default=True,
    help="Records the events are spread over.",
)
@click.option(
    "--samples",
    type=click.IntRange(1, 1000),
    default=20,
    show_default=True,
    help="Chunks the events are sent in; a sample after each.",
)
@click.option("--concurrency", type=click.IntRange(1, 512), default=32, show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=None,
    help="Worker processes  [default: 1 on SQLite, 2 on PostgreSQL]",
)
@click.option("--lanes", type=click.IntRange(1, 1024), default=64, show_default=True)
@click.option(
    "--store", type=click.Choice(["sqlite", "postgres"]), default="sqlite", show_default=True
)
@click.option("--redis-url", default="redis://127.0.0.1:6379/0", show_default=True)
@click.option("--pg-url", default=DEFAULT_PG_URL, show_default=True, envvar="KEYLANE_TEST_PG_URL")
@click.option("--keep-temp", is_flag=True, help="Keep the temporary directory (logs, SQLite).")
def main(
    events: int,
    keys: int,
    samples: int,
    concurrency: int,
    workers: int | None,
    lanes: int,
    store: str,
    redis_url: str,
    pg_url: str,
    keep_temp: bool,
) -> None:
    """Resident memory of the receiver and the workers, and Redis's, over a long run
    (see the module docstring)."""
    workers = worker_processes(store, workers)
    opts = BenchOptions(
        store=store,
        redis_url=redis_url,
        pg_url=pg_url,
        events=events,
        concurrency=concurrency,
        keys=(keys,),
        workers=workers,
        lanes=lanes,
        rounds=1,
        only=None,
        keep_temp=keep_temp,
    )
    try:
        with INTERRUPTS.installed(), ExitStack() as es:
            bench = Bench(opts, es)
            memory0 = used_memory(bench.redis)
            say(f"soak: {events} events over {keys} records, {workers} worker(s) x {lanes} lanes")
            run = soak(bench, samples, keys)
            grown = used_memory(bench.redis) - memory0
            per_key = dedupe_key_bytes(bench.redis, RedisKeys(bench.namespace))
            first, last = run[min(2, len(run) - 1)], run[-1]
            click.echo(
                f"\nresident memory from {first.sent} events to the end: receiver "
                f"{last.receiver_mib - first.receiver_mib:+.1f} MiB, workers "
                f"{last.workers_mib - first.workers_mib:+.1f} MiB"
            )
            click.echo(
                f"Redis per remembered event id: {grown / events:.0f} bytes (used_memory "
                f"grown over the run / events, told outcomes of the last hour included); "
                f"{per_key:.0f} bytes (MEMORY USAGE per id of up to {MEMORY_SAMPLE} hashes "
                "of remembered ids)"
            )
            click.echo("invariants: OK (every event in the journal once, every sum exact)")
            code = 0
    except BenchFailure as exc:
        click.echo(f"soak: {exc}", err=True)
        code = 1
    except KeyboardInterrupt:
        click.echo("soak: interrupted; everything it started was stopped", err=True)
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()

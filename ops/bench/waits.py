"""Waits end on time, and a waiting record holds up only itself:
``python -m keylane.ops.bench.waits``.

Two parts, each against a real local HTTP server that records when every call arrives and
when it was answered, on an otherwise idle deployment (``keylane serve`` and one ``keylane
worker`` at default settings but the shard count):

(a) **Back-off lateness**, once per ``--shards`` count (default 64 and 512): ``--records``
    records, each forwarded to a destination of its own (a ``Retry-After`` pauses the whole
    destination: one per record keeps the records' waits apart; ``adaptive = false``, as
    an adaptive one also lowers its rate after a Retry-After), get ``--events`` events
    each, one after the other. The server answers each event's first ``--fails`` calls
    ``503`` with ``Retry-After: --retry-after-s``, then ``200``. Lateness of a retry = its
    arrival - (the previous answer's time + the Retry-After): what a timer is late by, and
    what a scan would add. Target: p99 ≤ 0.5 s.
(b) **A failing record's shard-mates** (``--mates-shards``, default 64): record
    ``order:bad``'s destination answers ``503`` (no ``Retry-After``: it backs off by
    itself) for the whole run, while ``--mates`` records on its shard and ``--others``
    records on other shards get ``--per-record`` events each, sent at ``--rate`` events/s
    round robin. Latency = the server's ``200`` - the receiver's ``202``. Target: the
    shard-mates' p99 within 2x of the others'.

Every event of every record but ``order:bad`` must reach the server exactly once and in
its record's order (exit code 1 otherwise). Each run has its own Redis namespace and
SQLite store and stops every process it starts.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import click
import httpx

from ...routing import ShardMap
from ...routing.redis_keys import RedisKeys
from ..deployment_view import DeploymentView
from .procs import INTERRUPTS, Bench, BenchFailure, BenchOptions, keylane_argv, say, wait_for
from .versus_report import percentile


@dataclass(frozen=True)
class Call:
    """One call the server got: its record, event and sequence number, when it arrived and
    when it was answered (``time.time()``), and the status."""

    record: str
    event: str
    seq: int
    arrived: float
    answered: float
    status: int


@dataclass
class Destination:
    """The server's behaviour: ``fail_first`` 503s (with ``retry_after_s``) per event, and
    503 (without) for every call about a record in ``failing``."""

    fail_first: int = 0
    retry_after_s: int = 0
    failing: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: list[Call] = field(default_factory=list)
    _tries: dict[str, int] = field(default_factory=dict)

    def status(self, doc: dict[str, Any]) -> tuple[int, str | None]:
        """The status of a call about ``doc`` (and the Retry-After, if any)."""
        record, event = str(doc["order"]), str(doc["id"])
        if record in self.failing:
            return 503, None
        with self.lock:
            tries = self._tries[event] = self._tries.get(event, 0) + 1
        if tries <= self.fail_first:
            return 503, str(self.retry_after_s)
        return 200, None

    def note(self, doc: dict[str, Any], arrived: float, status: int) -> None:
        """Keep the call (once it is answered)."""
        call = Call(
            str(doc["order"]), str(doc["id"]), int(doc["seq"]), arrived, time.time(), status
        )
        with self.lock:
            self.calls.append(call)

    def delivered(self) -> list[Call]:
        """The calls answered 200, in arrival order."""
        with self.lock:
            return sorted((c for c in self.calls if c.status == 200), key=lambda c: c.arrived)


def serve(destination: Destination, es: ExitStack) -> str:
    """Start the server on a free port, in threads (stopped when ``es`` unwinds); its URL."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: no connection set-up in the figures

        def do_POST(self) -> None:
            arrived = time.time()
            doc = json.loads(self.rfile.read(int(self.headers["content-length"])))
            status, retry_after = destination.status(doc)
            self.send_response(status)
            if retry_after is not None:
                self.send_header("retry-after", retry_after)
            self.send_header("content-length", "0")
            self.end_headers()
            destination.note(doc, arrived, status)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    es.callback(server.server_close)
    es.callback(server.shutdown)  # first (the stack unwinds in reverse)
    return f"http://127.0.0.1:{server.server_address[1]}"


def sources_toml(url: str, destinations: int, adaptive: bool) -> str:
    """Source ``s<i>`` forwards its orders to destination ``d<i>`` (all at ``url``)."""
    extra = "" if adaptive else "adaptive = false\n"
    parts = []
    for i in range(destinations):
        parts.append(
            f'[sources.s{i}]\nevent_id = "body:id"\nrecord_key = "order:{{body:order}}"\n'
            f'destination = "d{i}"\n\n'
            f'[destinations.d{i}]\nkind = "http"\nurl = "{url}/hook"\n{extra}\n'
        )
    return "".join(parts)


@dataclass
class Deployment:
    """A receiver and one worker at default settings, over ``shards`` shards."""

    bench: Bench
    url: str

    def post(self, client: httpx.Client, source: str, body: dict[str, Any]) -> float:
        """Send one event; the time of its 202."""
        answer = client.post(f"{self.url}/webhooks/{source}", json=body)
        if answer.status_code != 202:
            raise BenchFailure(f"POST answered {answer.status_code}: {answer.text}")
        return time.time()


def start(
    opts: Options,
    shards: int,
    name: str,
    server_url: str,
    sources: int,
    es: ExitStack,
    adaptive: bool = True,
) -> Deployment:
    """A receiver and a worker forwarding ``sources`` sources to ``server_url``, once every
    shard is owned."""
    bench = Bench(_bench_options(opts, shards), es)
    path = bench.tmp / "sources.toml"
    path.write_text(sources_toml(server_url, sources, adaptive))
    env = {**bench.env, "KEYLANE_SOURCES_FILE": str(path)}
    port = _free_port()
    receiver = bench.start(
        f"{name}-receiver", keylane_argv("serve", "--port", str(port), "--ops-port", "0"), env
    )
    worker = bench.start(f"{name}-worker", keylane_argv("worker"), env)
    bench.wait_http(receiver, f"http://127.0.0.1:{port}/healthz")
    view = DeploymentView(bench.redis, RedisKeys(bench.namespace), ShardMap(shards))

    def owned() -> bool:
        if not worker.alive():
            raise BenchFailure(f"the worker exited:\n{worker.log_tail()}")
        return len(view.lease_values()) >= shards

    wait_for(owned, 120, f"{shards} shards owned", bench.logs_tail)
    return Deployment(bench, f"http://127.0.0.1:{port}")


# -- (a) back-off lateness ----------------------------------------------------------------


@dataclass(frozen=True)
class Lateness:
    """Part (a) at one shard count."""

    shards: int
    samples: list[float]
    elapsed_s: float


def run_lateness(opts: Options, shards: int) -> Lateness:
    """Each record's events, one after the other, each failing ``fails`` times first."""
    with ExitStack() as es:
        destination = Destination(fail_first=opts.fails, retry_after_s=opts.retry_after_s)
        server_url = serve(destination, es)
        # Not adaptive: after a Retry-After an adaptive destination also lowers its rate
        # (by design), which would be measured here as lateness.
        deployment = start(
            opts, shards, f"late{shards}", server_url, opts.records, es, adaptive=False
        )
        say(
            f"(a) {shards} shards: {opts.records} records x {opts.events} events, "
            f"each failing {opts.fails}x"
        )
        started = time.monotonic()

        def sender(record: int) -> None:
            with httpx.Client(timeout=30) as client:
                for seq in range(opts.events):
                    event = f"r{record}-{seq}"
                    body = {"id": event, "order": f"r{record}", "seq": seq}
                    deployment.post(client, f"s{record}", body)
                    wait_for(
                        lambda event=event: any(  # type: ignore[misc]
                            c.event == event for c in destination.delivered()
                        ),
                        opts.fails * opts.retry_after_s * 20 + 60,
                        f"event {event} delivered",
                        deployment.bench.logs_tail,
                    )

        threads = [threading.Thread(target=sender, args=(r,)) for r in range(opts.records)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        deployment.bench.stop_all()
    _check_once_in_order(destination, {f"r{r}": opts.events for r in range(opts.records)})
    return Lateness(shards, _lateness(destination, opts.retry_after_s), elapsed)


def _lateness(destination: Destination, retry_after_s: int) -> list[float]:
    """For each call that followed a 503 of its event: how long after the announced time
    (the 503's answer + the Retry-After) it arrived."""
    by_event: dict[str, list[Call]] = {}
    for call in sorted(destination.calls, key=lambda c: c.arrived):
        by_event.setdefault(call.event, []).append(call)
    out = []
    for calls in by_event.values():
        for before, after in itertools.pairwise(calls):
            if before.status == 503:
                out.append(after.arrived - (before.answered + retry_after_s))
    return out


# -- (b) a failing record's shard-mates ------------------------------------------------------


@dataclass(frozen=True)
class Mates:
    """Part (b): accept -> applied latencies of the failing record's shard-mates and of
    records on other shards."""

    shards: int
    mates: list[float]
    others: list[float]
    bad_calls: int


def run_mates(opts: Options) -> Mates:
    """``order:bad`` fails throughout; the others' events are sent at ``rate``."""
    shards = opts.mates_shards
    shard_map = ShardMap(shards)
    bad_shard = shard_map.shard_for_key("order:bad")
    mates = _records(shard_map, lambda s: s == bad_shard, opts.mates, "m")
    others = _records(shard_map, lambda s: s != bad_shard, opts.others, "o")
    with ExitStack() as es:
        destination = Destination(failing={"bad"})
        server_url = serve(destination, es)
        deployment = start(opts, shards, "mates", server_url, 1, es)
        accepted: dict[str, float] = {}
        with httpx.Client(timeout=30) as client:
            for seq in range(3):
                deployment.post(client, "s0", {"id": f"bad-{seq}", "order": "bad", "seq": seq})
            wait_for(
                lambda: any(c.record == "bad" for c in destination.calls),
                60,
                "order:bad's first call",
                deployment.bench.logs_tail,
            )
            records = mates + others
            total = len(records) * opts.per_record
            say(f"(b) {shards} shards: {total} events over {len(records)} records at {opts.rate}/s")
            t0 = time.monotonic()
            for n in range(total):
                record, seq = records[n % len(records)], n // len(records)
                time.sleep(max(0.0, t0 + n / opts.rate - time.monotonic()))
                event = f"{record}-{seq}"
                accepted[event] = deployment.post(
                    client, "s0", {"id": event, "order": record, "seq": seq}
                )
        wait_for(
            lambda: len(destination.delivered()) >= total,
            total / opts.rate * 5 + 60,
            f"{total} events delivered",
            deployment.bench.logs_tail,
        )
        bad_calls = sum(1 for c in destination.calls if c.record == "bad")
        deployment.bench.stop_all()
    _check_once_in_order(destination, dict.fromkeys(records, opts.per_record))
    latency = {c.event: c.arrived - accepted[c.event] for c in destination.delivered()}
    return Mates(
        shards,
        [v for e, v in latency.items() if e.startswith("m")],
        [v for e, v in latency.items() if e.startswith("o")],
        bad_calls,
    )


def _records(
    shard_map: ShardMap, where: Callable[[int], bool], count: int, prefix: str
) -> list[str]:
    """``count`` order ids whose records (``order:<id>``) hash to a shard ``where`` accepts."""
    found: list[str] = []
    n = 0
    while len(found) < count:
        if where(shard_map.shard_for_key(f"order:{prefix}{n}")):
            found.append(f"{prefix}{n}")
        n += 1
    return found


def _check_once_in_order(destination: Destination, expected: dict[str, int]) -> None:
    """Each record's events delivered (200) exactly once, in order."""
    seqs: dict[str, list[int]] = {}
    for call in destination.delivered():
        seqs.setdefault(call.record, []).append(call.seq)
    for record, count in expected.items():
        if seqs.get(record) != list(range(count)):
            raise BenchFailure(f"record {record}: delivered {seqs.get(record)}, not 0..{count - 1}")


# -- the command ------------------------------------------------------------------------------


def _bench_options(opts: Options, shards: int) -> BenchOptions:
    return BenchOptions(
        store="sqlite",
        redis_url=opts.redis_url,
        pg_url="",
        events=0,
        concurrency=1,
        keys=(1,),
        workers=1,
        lanes=0,  # not passed on: the worker runs its default lanes
        rounds=1,
        only=None,
        keep_temp=False,
        shards=shards,
    )


def _free_port() -> int:
    from ..embedded_redis import free_port

    return free_port()


@dataclass(frozen=True)
class Options:
    """What to run."""

    shards: tuple[int, ...]
    records: int
    events: int
    fails: int
    retry_after_s: int
    mates_shards: int
    mates: int
    others: int
    per_record: int
    rate: float
    redis_url: str
    only: str | None


def _ms(values: list[float], pct: float) -> str:
    return f"{percentile(values, pct) * 1000:.0f}"


def render(lateness: list[Lateness], mates: Mates | None, opts: Options) -> str:
    """The tables."""
    load = os.getloadavg()
    lines = [f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} CPUs"]
    if lateness:
        lines += [
            f"(a) back-off lateness: {opts.records} records x {opts.events} events, each "
            f"answered 503 with Retry-After: {opts.retry_after_s} {opts.fails}x, then 200; "
            "lateness = next call - (503 answer + Retry-After)",
            f"{'SHARDS':>7}{'RETRIES':>9}{'P50 MS':>8}{'P99 MS':>8}{'MAX MS':>8}{'MIN MS':>8}"
            f"{'ELAPSED S':>11}  TARGET p99 <= 500 ms",
        ]
        for run in lateness:
            ok = percentile(run.samples, 99) <= 0.5
            lines.append(
                f"{run.shards:>7}{len(run.samples):>9}{_ms(run.samples, 50):>8}"
                f"{_ms(run.samples, 99):>8}{_ms(run.samples, 100):>8}"
                f"{min(run.samples) * 1000:>8.0f}{run.elapsed_s:>11.1f}  "
                + ("met" if ok else "MISSED")
            )
    if mates is not None:
        ratio = percentile(mates.mates, 99) / percentile(mates.others, 99)
        lines += [
            f"(b) order:bad answered 503 throughout ({mates.bad_calls} calls); "
            f"{opts.per_record} events each to {opts.mates} records on its shard and "
            f"{opts.others} on others, {opts.rate:g} events/s; {mates.shards} shards; "
            "latency = server's 200 - receiver's 202",
            f"{'RECORDS':<22}{'EVENTS':>7}{'P50 MS':>8}{'P99 MS':>8}{'MAX MS':>8}",
            f"{'shard-mates of bad':<22}{len(mates.mates):>7}{_ms(mates.mates, 50):>8}"
            f"{_ms(mates.mates, 99):>8}{_ms(mates.mates, 100):>8}",
            f"{'on other shards':<22}{len(mates.others):>7}{_ms(mates.others, 50):>8}"
            f"{_ms(mates.others, 99):>8}{_ms(mates.others, 100):>8}",
            f"shard-mates' p99 / others' p99 = {ratio:.2f}  TARGET <= 2: "
            + ("met" if ratio <= 2 else "MISSED"),
        ]
    lines.append("every event of every record but order:bad delivered once, in its record's order")
    return "\n".join(lines)


def _shard_counts(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise click.BadParameter("a comma-separated list of shard counts")
    return counts


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, help=__doc__)
@click.option("--shards", default="64,512", show_default=True, callback=_shard_counts)
@click.option("--records", default=10, show_default=True, help="(a) records, each its destination.")
@click.option("--events", default=4, show_default=True, help="(a) events per record.")
@click.option("--fails", default=3, show_default=True, help="(a) 503s per event before its 200.")
@click.option("--retry-after-s", default=1, show_default=True, help="(a) the 503s' Retry-After.")
@click.option("--mates-shards", default=64, show_default=True, help="(b) shard count.")
@click.option("--mates", default=10, show_default=True, help="(b) records on order:bad's shard.")
@click.option("--others", default=90, show_default=True, help="(b) records on other shards.")
@click.option("--per-record", default=20, show_default=True, help="(b) events per record.")
@click.option("--rate", default=50.0, show_default=True, help="(b) events sent per second.")
@click.option(
    "--redis-url",
    default=lambda: os.environ.get("KEYLANE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
)
@click.option("--only", type=click.Choice(["lateness", "mates"]), default=None)
def main(**kwargs: Any) -> None:
    """Run (a) at each shard count, then (b); print the tables."""
    opts = Options(**kwargs)
    lateness: list[Lateness] = []
    mates: Mates | None = None
    with INTERRUPTS.installed():
        if opts.only in (None, "lateness"):
            lateness = [run_lateness(opts, shards) for shards in opts.shards]
        if opts.only in (None, "mates"):
            mates = run_mates(opts)
    click.echo(render(lateness, mates, opts))


if __name__ == "__main__":
    main()

"""A destination that admits fewer calls than keylane is configured to make:
``python -m keylane.ops.bench.throttled``.

A local HTTP server admits at most ``--admit`` calls in any one second (a sliding window
of the calls it answered 200) and answers every other call ``429`` with ``Retry-After:
--retry-after``. keylane forwards ``--events`` events over ``--records`` records to it
through a destination configured at ``rate_per_s = --rate``, twice in one run: with the
rate fixed (``adaptive = false``: every 429 pauses the destination for the Retry-After,
then calls resume at the configured rate) and adaptive (the default: after a 429 the
destination's rate is lowered, then raised slowly while calls succeed). Printed for each:
events/s (events delivered over the time from the first call to the last event's 200),
the calls made and the 429s among them, and each run is checked: every event delivered
once, each record's events in order.

Each run has its own Redis namespace and SQLite store and stops what it starts.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from typing import Any

import click
import httpx

from .procs import (
    INTERRUPTS,
    Bench,
    BenchFailure,
    BenchOptions,
    keylane_argv,
    say,
    wait_for,
)


@dataclass
class Limited:
    """The destination: admits ``admit`` calls per sliding second, else 429."""

    admit: int
    retry_after_s: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    admitted: deque[float] = field(default_factory=deque)
    calls: list[tuple[float, int, dict[str, Any]]] = field(default_factory=list)

    def answer(self, doc: dict[str, Any]) -> int:
        """The status of one call (and record it)."""
        with self.lock:
            now = time.monotonic()
            while self.admitted and now - self.admitted[0] >= 1.0:
                self.admitted.popleft()
            status = 200 if len(self.admitted) < self.admit else 429
            if status == 200:
                self.admitted.append(now)
            self.calls.append((now, status, doc))
            return status


def serve(limited: Limited) -> ThreadingHTTPServer:
    """Start the destination on a free port, in a thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            doc = json.loads(self.rfile.read(int(self.headers["content-length"])))
            status = limited.answer(doc)
            self.send_response(status)
            if status == 429:
                self.send_header("retry-after", str(limited.retry_after_s))
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass(frozen=True)
class Run:
    """One run's figures."""

    mode: str
    events: int
    elapsed_s: float
    calls: int
    throttled: int
    #: 429s in the second half of the run (from the middle delivery on): an adaptive rate
    #: has settled by then and meets none, a fixed one keeps meeting the limit
    late_throttled: int
    busiest_second: int
    longest_gap_s: float  # between two calls the destination saw: a stall shows here

    @property
    def events_per_s(self) -> float:
        return self.events / self.elapsed_s if self.elapsed_s else 0.0


def sources_toml(url: str, rate: float, adaptive: bool) -> str:
    """One source forwarding to the limited destination."""
    return (
        '[sources.orders]\nevent_id = "body:id"\nrecord_key = "order:{body:order}"\n'
        'destination = "api"\n\n'
        f'[destinations.api]\nkind = "http"\nurl = "{url}/hook"\nrate_per_s = {rate}\n'
        + ("" if adaptive else "adaptive = false\n")
    )


def run_once(opts: Options, adaptive: bool, es: ExitStack) -> Run:
    """Start a receiver and a worker, send the events, wait for every one to be
    delivered; the figures, checked."""
    mode = "adaptive" if adaptive else "fixed"
    limited = Limited(opts.admit, opts.retry_after_s)
    server = serve(limited)
    es.callback(server.server_close)
    es.callback(server.shutdown)  # first (the stack unwinds in reverse)
    bench = Bench(_bench_options(opts), es)
    path = bench.tmp / "sources.toml"
    url = f"http://127.0.0.1:{server.server_address[1]}"
    path.write_text(sources_toml(url, opts.rate, adaptive))
    env = {**bench.env, "KEYLANE_SOURCES_FILE": str(path)}
    port = _free_port()
    receiver = bench.start(
        f"{mode}-receiver", keylane_argv("serve", "--port", str(port), "--ops-port", "0"), env
    )
    bench.start(f"{mode}-worker", keylane_argv("worker"), env)
    bench.wait_http(receiver, f"http://127.0.0.1:{port}/healthz")
    say(f"{mode}: sending {opts.events} events over {opts.records} records")
    with httpx.Client(timeout=30) as client:
        for n in range(opts.events):
            order = n % opts.records
            body = {"id": f"e{n}", "order": f"o{order}", "seq": n // opts.records}
            answer = client.post(f"http://127.0.0.1:{port}/webhooks/orders", json=body)
            if answer.status_code != 202:
                raise BenchFailure(f"{mode}: POST answered {answer.status_code}: {answer.text}")

    def delivered() -> int:
        with limited.lock:
            return len({doc["id"] for _, status, doc in limited.calls if status == 200})

    wait_for(
        lambda: delivered() >= opts.events,
        opts.events * 5 + 60,
        f"{opts.events} events delivered ({mode})",
        lambda: f"delivered {delivered()}\n{bench.logs_tail()}",
    )
    bench.stop_all()
    return _figures(mode, limited, opts)


def _figures(mode: str, limited: Limited, opts: Options) -> Run:
    calls = limited.calls
    ok = [(at, doc) for at, status, doc in calls if status == 200]
    ids = [doc["id"] for _, doc in ok]
    if len(ids) != len(set(ids)) or len(ids) != opts.events:
        raise BenchFailure(f"{mode}: {len(ids)} deliveries of {len(set(ids))} events")
    for order in range(opts.records):
        seqs = [doc["seq"] for _, doc in ok if doc["order"] == f"o{order}"]
        if seqs != sorted(seqs):
            raise BenchFailure(f"{mode}: order o{order} delivered out of order: {seqs}")
    times = [at for at, _ in ok]
    busiest = max(sum(1 for u in times if t <= u < t + 1.0) for t in times)
    starts = [at for at, _, _ in calls]
    gap = max((b - a for a, b in pairwise(starts)), default=0.0)
    return Run(
        mode=mode,
        events=len(ids),
        elapsed_s=times[-1] - calls[0][0],
        calls=len(calls),
        throttled=sum(1 for _, status, _ in calls if status == 429),
        late_throttled=sum(
            1 for at, status, _ in calls if status == 429 and at >= times[len(times) // 2]
        ),
        busiest_second=busiest,
        longest_gap_s=gap,
    )


def _bench_options(opts: Options) -> BenchOptions:
    return BenchOptions(
        store="sqlite",
        redis_url=opts.redis_url,
        pg_url="",
        events=opts.events,
        concurrency=1,
        keys=(opts.records,),
        workers=1,
        lanes=64,
        rounds=1,
        only=None,
        keep_temp=False,
    )


def _free_port() -> int:
    from ..embedded_redis import free_port

    return free_port()


@dataclass(frozen=True)
class Options:
    """What to run."""

    admit: int
    retry_after_s: int
    rate: float
    events: int
    records: int
    redis_url: str


@click.command(help=__doc__)
@click.option("--admit", default=4, show_default=True, help="Calls the destination admits per s.")
@click.option("--retry-after", "retry_after_s", default=1, show_default=True)
@click.option("--rate", default=20.0, show_default=True, help="The destination's rate_per_s.")
@click.option("--events", default=60, show_default=True)
@click.option("--records", default=8, show_default=True)
@click.option(
    "--redis-url",
    default=lambda: os.environ.get("KEYLANE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"),
)
@click.option("--modes", default="fixed,adaptive", show_default=True)
def main(**kwargs: Any) -> None:
    """Run each mode, print the table."""
    modes = kwargs.pop("modes").split(",")
    opts = Options(**kwargs)
    runs = []
    load = os.getloadavg()
    with INTERRUPTS.installed(), ExitStack() as es:
        for mode in modes:
            runs.append(run_once(opts, mode == "adaptive", es))
    print(
        f"destination admits {opts.admit} calls/s (429 with Retry-After: {opts.retry_after_s}); "
        f"keylane configured at rate_per_s = {opts.rate:g}; {opts.events} events over "
        f"{opts.records} records; load average {load[0]:.1f} at the start"
    )
    print(
        f"{'RATE':<10}{'EVENTS/S':>10}{'ELAPSED S':>11}{'CALLS':>7}{'429S':>6}{'LATE':>6}"
        f"{'BUSIEST 1S':>12}{'LONGEST GAP S':>15}"
    )
    for run in runs:
        print(
            f"{run.mode:<10}{run.events_per_s:>10.2f}{run.elapsed_s:>11.1f}{run.calls:>7}"
            f"{run.throttled:>6}{run.late_throttled:>6}{run.busiest_second:>12}{run.longest_gap_s:>15.2f}"
        )
    print("every event delivered once, each record's events in order")


if __name__ == "__main__":
    main()

"""What waiting for an outcome costs: ``python -m keylane.ops.bench.told``.

One run, one deployment (a private Redis namespace and store, ``--workers`` worker
processes of ``--lanes`` lanes; each measured part on a receiver started fresh for it):

(a) **Waited against fire-and-forget**, at each ``--clients`` count (default 32 and 512),
    the two side by side: ``wrk -t--threads -c<clients> -d--duration`` POSTing new events
    (the ``demo`` source, keylane's envelope, one of 1,024 record keys per wrk thread)
    without ``Prefer`` (answered 202) and with ``Prefer: wait=--wait`` (answered 200 once
    the lane has applied the event; 202 if not known in time). Before each, a 2 s warm-up
    of the same load and a drain (every accepted event decided). For each: requests/s,
    p50/p99 latency, answers that were not 2xx, how many were told their outcome, the
    receiver's CPU per accepted request (while wrk runs), the workers' CPU per decided
    event (until the phase's events are all decided), the lanes' own time from accept to
    decision apart (mean, and p50/p99 from the lanes' latency histogram, the one
    ``/metrics`` exposes: it includes the time an event queued behind earlier ones), and
    wrk's own CPU. Then **202 paced**: the 202 path again at the same client count, each
    connection pausing between requests (wrk's ``delay``) so that it runs at the waited
    path's request rate (the pause set from the warm-up's rate). Then the waited/202
    ratios: at the same client count, and at the same request rate; the target is
    receiver CPU per waited request <= 1.5x the 202 path's. (A receiver's CPU per request
    falls as its rate rises: more requests share each wake-up of its event loop. At 32
    clients the 202 path runs about 3x the waited rate, so the same-clients ratio counts
    that too; the same-rate ratio is what waiting itself costs.)
(b) **Memory per waiting request**, for each ``--waiting`` count K (default 1,000 and
    5,000), before any worker runs (so nothing is decided): a fresh receiver, warmed by
    100 waited requests; its RSS; then K connections each send one event with
    ``Prefer: wait=30`` and hold; once the accept count says all K are in, its RSS again.
    (RSS during - RSS before) / K, which counts the connection's objects in the receiver
    as well as the wait's.

Every process started is stopped (on Ctrl-C too), the namespace's keys deleted and the
store removed (``keylane.ops.bench.procs``). Not part of the wheel (``ops/bench``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import click

from ...routing.contract.replies import reply_int
from ...routing.redis_keys import LATENCY_BUCKETS_S, RedisKeys
from ...workers.store import JournalStore
from ...workers.stores import open_store
from ..embedded_redis import free_port
from .phases import start_workers
from .procs import (
    INTERRUPTS,
    Bench,
    BenchFailure,
    BenchOptions,
    Child,
    keylane_argv,
    redis_cpu_s,
    say,
    wait_for,
    worker_processes,
)
from .wrk import ensure_wrk

WARMUP_S = 2
#: How long the receiver's idle CPU is measured before each load.
IDLE_S = 2.0
#: After wrk stops, how long the requests it left in flight get before the receiver's CPU
#: and the accept count are read.
SETTLE_S = 1.0
#: The wait of the requests held in (b): the receiver's cap (KEYLANE_OUTCOME_WAIT_MAX_S).
HOLD_WAIT_S = 30
MARK = "KEYLANE_TOLD "
#: The 202 path at the waited path's request rate.
PACED = "202 paced"
#: Warm-ups that set the paced path's pause (each corrects it by the rate it saw).
PACING_ROUNDS = 3
#: Waiting requests sent at once in (b).
PACE = 50

# wrk's Lua: a new event id per request, ``Prefer`` when given (args[2]), a pause of
# args[3] ms before each request (0: none); the answers counted by status in each thread,
# summed by ``done`` into one JSON line.
SCRIPT = r"""
local threads, next_thread, n = {}, 0, 0
local tag, headers = "told", {}

function setup(thread)
  thread:set("tid", next_thread)
  next_thread = next_thread + 1
  table.insert(threads, thread)
end

local pause = 0
function init(args)
  tag = (args[1] or "told") .. "-" .. tostring(tid)
  headers = {["Content-Type"] = "application/json"}
  if args[2] and args[2] ~= "" then headers["Prefer"] = args[2] end
  pause = tonumber(args[3] or "0") or 0
end

function delay()
  return pause
end

function request()
  n = n + 1
  local body = string.format(
    '{"id": "%s-%d", "type": "bench.increment", "record_key": "told:%s:%d", ' ..
    '"changes": {"n": {"increment": 1}}}', tag, n, tag, n % 1024)
  return wrk.format("POST", nil, headers, body)
end

s200, s202, sother = 0, 0, 0
function response(status, hdrs, body)
  if status == 200 then s200 = s200 + 1
  elseif status == 202 then s202 = s202 + 1
  else sother = sother + 1 end
end

function done(summary, latency, requests)
  local a, b, c = 0, 0, 0
  for _, t in ipairs(threads) do
    a = a + t:get("s200"); b = b + t:get("s202"); c = c + t:get("sother")
  end
  local e = summary.errors
  io.write(string.format(
    'KEYLANE_TOLD {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, ' ..
    '"s200": %d, "s202": %d, "other": %d, "socket_errors": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    a, b, c, e.connect + e.read + e.write + e.timeout))
end
"""


@dataclass(frozen=True)
class Load:
    """One wrk run: what it counted, and the CPU it used."""

    requests: int
    elapsed_s: float
    p50_ms: float
    p99_ms: float
    s200: int
    s202: int
    other: int
    socket_errors: int
    wrk_cpu_s: float


def wrk_load(
    wrk: str,
    url: str,
    tag: str,
    prefer: str,
    clients: int,
    duration_s: float,
    threads: int,
    pause_ms: int = 0,
) -> Load:
    """``wrk -t THREADS -c CLIENTS -d DURATION --timeout 60s`` POSTing new events to ``url``
    (with ``Prefer: PREFER`` unless empty; each connection pausing ``pause_ms`` before
    each request)."""
    with tempfile.TemporaryDirectory(prefix="kltold-") as tmp:
        script = Path(tmp) / "told.lua"
        script.write_text(SCRIPT)
        argv = [wrk, f"-t{threads}", f"-c{clients}", f"-d{duration_s}s", "--timeout", "60s"]
        argv += ["--latency", "-s", str(script), url, "--", tag, prefer, str(pause_ms)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        try:
            text = proc.stdout.read().decode(errors="replace")
            _pid, status, usage = os.wait4(proc.pid, 0)
        except BaseException:  # Ctrl-C, SIGTERM: wrk stops with the run
            proc.kill()
            proc.wait()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [ln for ln in text.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise BenchFailure(f"wrk exited {proc.returncode}:\n{text}")
    data = json.loads(lines[0][len(MARK) :])
    return Load(
        requests=int(data["requests"]),
        elapsed_s=data["duration_us"] / 1e6,
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        s200=int(data["s200"]),
        s202=int(data["s202"]),
        other=int(data["other"]),
        socket_errors=int(data["socket_errors"]),
        wrk_cpu_s=usage.ru_utime + usage.ru_stime,
    )


# -- the lanes' latency histogram -------------------------------------------------------


def latency_hash(bench: Bench) -> dict[str, float]:
    """The lanes' accept-to-decision histogram as it is now (bucket counts, count, sum)."""
    raw = bench.redis.hgetall(RedisKeys(bench.namespace).latency)
    return {k.decode(): float(v) for k, v in raw.items()}  # type: ignore[union-attr]


@dataclass(frozen=True)
class LaneTime:
    """The lanes' time from accept to decision over a phase: events, mean, p50, p99 (s)."""

    events: int
    mean_s: float
    p50_s: float
    p99_s: float


def lane_time(before: dict[str, float], after: dict[str, float]) -> LaneTime:
    """The histogram's growth between two readings: mean exact, percentiles interpolated
    within a bucket (as Prometheus' ``histogram_quantile``)."""
    count = after.get("count", 0.0) - before.get("count", 0.0)
    if count <= 0:
        return LaneTime(0, 0.0, 0.0, 0.0)
    total = after.get("sum", 0.0) - before.get("sum", 0.0)
    bounds = [(repr(b), b) for b in LATENCY_BUCKETS_S] + [("+Inf", LATENCY_BUCKETS_S[-1])]
    counts = [after.get(name, 0.0) - before.get(name, 0.0) for name, _ in bounds]

    def quantile(q: float) -> float:
        target, seen, lower = q * count, 0.0, 0.0
        for (_name, upper), n in zip(bounds, counts, strict=True):
            if n > 0 and seen + n >= target:
                return lower + (upper - lower) * (target - seen) / n
            seen, lower = seen + n, upper
        return LATENCY_BUCKETS_S[-1]

    return LaneTime(int(count), total / count, quantile(0.5), quantile(0.99))


# -- (a) waited against fire-and-forget ----------------------------------------------------


@dataclass(frozen=True)
class Phase:
    """One mode at one client count."""

    mode: str
    clients: int
    load: Load
    accepted: int  # events the receiver accepted while wrk ran (and SETTLE_S after)
    receiver_cpu_s: float
    #: What the receiver spends idle (its background tasks) over as long, measured just
    #: before: :attr:`net_receiver_ms` leaves it out.
    receiver_idle_cpu_s: float
    redis_cpu_s: float
    decided: int
    workers_cpu_s: float
    lane: LaneTime

    @property
    def per_s(self) -> float:
        """Requests answered per second."""
        return self.load.requests / self.load.elapsed_s if self.load.elapsed_s else 0.0

    @property
    def receiver_ms(self) -> float:
        """Receiver CPU ms per accepted request."""
        return self.receiver_cpu_s * 1000 / max(1, self.accepted)

    @property
    def net_receiver_ms(self) -> float:
        """Receiver CPU ms per accepted request, its idle CPU left out."""
        net_s = max(0.0, self.receiver_cpu_s - self.receiver_idle_cpu_s)
        return net_s * 1000 / max(1, self.accepted)

    @property
    def worker_ms(self) -> float:
        """Worker CPU ms per decided event."""
        return self.workers_cpu_s * 1000 / max(1, self.decided)


def accepted_count(bench: Bench) -> int:
    """The accept script's count of accepted events, all of this run."""
    return reply_int(bench.redis.hget(RedisKeys(bench.namespace).counters, "accepted"))


def drain(bench: Bench, store: JournalStore) -> None:
    """Wait until the journal holds every accepted event."""
    wait_for(
        lambda: store.journal_size() >= accepted_count(bench),
        600,
        "every accepted event decided",
        lambda: f"journal {store.journal_size()} of {accepted_count(bench)}\n{bench.logs_tail()}",
        0.2,
    )


@contextlib.contextmanager
def fresh_receiver(bench: Bench, name: str) -> Iterator[tuple[Child, str]]:
    """A receiver of its own, stopped when the block ends."""
    with contextlib.ExitStack() as es:
        port = free_port()
        proc = bench.start(
            name, keylane_argv("serve", "--port", str(port), "--ops-port", "0"), es=es
        )
        url = f"http://127.0.0.1:{port}"
        bench.wait_http(proc, f"{url}/readyz")
        yield proc, url


def run_phase(
    bench: Bench,
    store: JournalStore,
    workers: list[Child],
    opts: ToldOptions,
    mode: str,
    clients: int,
    rate: float | None = None,
) -> Phase:
    """One mode (``202`` or ``wait=N``) at ``clients`` connections, on a fresh receiver;
    with ``rate`` (requests/s), each connection pauses so that the whole runs at about
    that rate (the pause set from the warm-up's rate at a first guess)."""
    prefer = "" if mode.startswith("202") else mode
    tag = f"{mode.replace('=', '').replace(' ', '')}-c{clients}"
    with fresh_receiver(bench, f"receiver-{tag}") as (receiver, url):
        target = f"{url}/webhooks/demo"
        cycle_ms = clients * 1000 / rate if rate else 0.0
        # A first guess (a request takes ~1 ms at that rate), corrected by each warm-up's
        # rate: what a request took there is its cycle less the pause.
        pause_ms = max(0, round(cycle_ms - 1)) if rate else 0
        for n in range(PACING_ROUNDS if rate else 1):
            warm = wrk_load(
                opts.wrk, target, f"warm{n}-{tag}", prefer, clients, WARMUP_S, opts.threads,
                pause_ms,
            )  # fmt: skip
            if rate and warm.requests:
                took_ms = clients * 1000 * warm.elapsed_s / warm.requests - pause_ms
                pause_ms = max(0, round(cycle_ms - max(0.0, took_ms)))
        drain(bench, store)
        idle0 = receiver.cpu_s()
        time.sleep(IDLE_S)
        idle_rate = (receiver.cpu_s() - idle0) / IDLE_S
        say(f"(a) {mode} at {clients} clients: wrk -t{opts.threads} -d{opts.duration_s}s")
        receiver0, redis0 = receiver.cpu_s(), redis_cpu_s(bench.redis)
        started = time.perf_counter()
        workers0 = sum(w.tree_cpu_s() for w in workers)
        accepted0, journal0, hist0 = (
            accepted_count(bench),
            store.journal_size(),
            latency_hash(bench),
        )
        load = wrk_load(
            opts.wrk, target, tag, prefer, clients, opts.duration_s, opts.threads, pause_ms
        )
        time.sleep(SETTLE_S)
        receiver_s = receiver.cpu_s() - receiver0
        busy_s = time.perf_counter() - started
        accepted = accepted_count(bench) - accepted0
        drain(bench, store)
        phase = Phase(
            mode=mode,
            clients=clients,
            load=load,
            accepted=accepted,
            receiver_cpu_s=receiver_s,
            receiver_idle_cpu_s=idle_rate * busy_s,
            redis_cpu_s=redis_cpu_s(bench.redis) - redis0,
            decided=store.journal_size() - journal0,
            workers_cpu_s=sum(w.tree_cpu_s() for w in workers) - workers0,
            lane=lane_time(hist0, latency_hash(bench)),
        )
    say(
        f"(a)   {phase.per_s:,.0f} requests/s, p99 {load.p99_ms:.1f} ms, receiver "
        f"{phase.receiver_ms:.3f} ms CPU/request"
    )
    return phase


# -- (b) memory per waiting request ------------------------------------------------------


def rss_kib(pid: int) -> int:
    """The resident set of ``pid`` in KiB (``/proc/<pid>/status`` VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise BenchFailure(f"no VmRSS for pid {pid}")


def _request(event_id: str, wait_s: int) -> bytes:
    body = json.dumps(
        {
            "id": event_id,
            "type": "bench.increment",
            "record_key": f"told:hold:{event_id}",
            "changes": {"n": {"increment": 1}},
        }
    ).encode()
    head = (
        "POST /webhooks/demo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Prefer: wait={wait_s}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _connect(port: int, count: int) -> list[Connection]:
    """``count`` connections to the receiver, 200 opening at a time."""
    gate = asyncio.Semaphore(200)

    async def one() -> Connection:
        async with gate:
            return await asyncio.open_connection("127.0.0.1", port)

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def _ask(conn: Connection, event_id: str, wait_s: int) -> bytes:
    """Send one waited event on ``conn`` and read the answer's first bytes."""
    reader, writer = conn
    writer.write(_request(event_id, wait_s))
    await writer.drain()
    return await reader.read(64)


async def _send_paced(
    bench: Bench, receiver: Child, conns: list[Connection], ids: list[str], wait_s: int
) -> list[asyncio.Task[bytes]]:
    """One waiting request per id, each on its connection, :data:`PACE` at a time: the next
    ones are sent once the accept count says these are in, so the RSS read counts waiting
    requests, not requests queued for an accept (nor a pool of Redis connections grown for
    thousands of accepts at once)."""
    tasks: list[asyncio.Task[bytes]] = []
    accepted0 = accepted_count(bench)
    deadline = time.monotonic() + HOLD_WAIT_S - 5
    for start in range(0, len(ids), PACE):
        batch = zip(conns[start : start + PACE], ids[start : start + PACE], strict=True)
        tasks += [asyncio.create_task(_ask(conn, i, wait_s)) for conn, i in batch]
        while accepted_count(bench) - accepted0 < len(tasks):
            if time.monotonic() > deadline or not receiver.alive():
                answers = [t.result() for t in tasks if t.done() and not t.exception()]
                raise BenchFailure(
                    f"only {accepted_count(bench) - accepted0} of {len(tasks)} waiting "
                    f"requests accepted; answered early: {answers[:3]}\n{receiver.log_tail()}"
                )
            await asyncio.sleep(0.01)
    return tasks


def _close(conns: list[Connection]) -> None:
    for _reader, writer in conns:
        writer.close()


@dataclass(frozen=True)
class Memory:
    """RSS of a receiver before, with ``waiting`` idle connections open, and while a
    request waits on each."""

    waiting: int
    before_kib: int
    connected_kib: int
    during_kib: int
    answered_early: int

    @property
    def per_request_kib(self) -> float:
        """(during - before) / waiting: the connection and the waiting request."""
        return (self.during_kib - self.before_kib) / self.waiting

    @property
    def per_connection_kib(self) -> float:
        """(connected - before) / waiting: an idle connection alone."""
        return (self.connected_kib - self.before_kib) / self.waiting


async def _measure_memory(bench: Bench, receiver: Child, port: int, k: int, tag: str) -> Memory:
    conns = await _connect(port, 100)
    try:
        warm = [f"{tag}-warm-{n}" for n in range(100)]
        await asyncio.gather(*await _send_paced(bench, receiver, conns, warm, 1))
    finally:  # each answered 202 after its 1 s: no worker runs
        _close(conns)
    await asyncio.sleep(0.5)
    before = rss_kib(receiver.pid)
    conns = await _connect(port, k)
    tasks: list[asyncio.Task[bytes]] = []
    try:
        await asyncio.sleep(0.5)
        connected = rss_kib(receiver.pid)
        ids = [f"{tag}-{n}" for n in range(k)]
        tasks = await _send_paced(bench, receiver, conns, ids, HOLD_WAIT_S)
        await asyncio.sleep(0.5)
        during = rss_kib(receiver.pid)
        early = sum(1 for t in tasks if t.done())
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        _close(conns)
    return Memory(k, before, connected, during, early)


def run_memory(bench: Bench, k: int) -> Memory:
    """(b) for ``k`` waiting requests, on a fresh receiver; no worker may run."""
    with fresh_receiver(bench, f"receiver-hold-{k}") as (receiver, url):
        say(f"(b) holding {k:,} waiting requests on a fresh receiver")
        port = int(url.rsplit(":", 1)[1])
        memory = asyncio.run(_measure_memory(bench, receiver, port, k, f"hold{k}"))
        receiver.process.kill()  # its requests would otherwise be waited for on stop
    say(f"(b)   {memory.per_request_kib:.1f} KiB per waiting request")
    return memory


# -- the run -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToldOptions:
    """What to measure, and where."""

    store: str
    redis_url: str
    pg_url: str
    workers: int
    lanes: int
    duration_s: int
    clients: tuple[int, ...]
    wait_s: int
    waiting: tuple[int, ...]
    threads: int
    keep_temp: bool
    wrk: str = ""


def command_line(opts: ToldOptions) -> str:
    """The command that reproduces the run."""
    argv = ["python", "-m", "keylane.ops.bench.told", "--store", opts.store]
    argv += ["--workers", str(opts.workers), "--lanes", str(opts.lanes)]
    argv += ["--duration", str(opts.duration_s), "--clients", ",".join(map(str, opts.clients))]
    argv += ["--wait", str(opts.wait_s), "--waiting", ",".join(map(str, opts.waiting))]
    argv += ["--threads", str(opts.threads)]
    return shlex.join(argv)


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def render(
    opts: ToldOptions, phases: list[Phase], memory: list[Memory], load: tuple[float, ...]
) -> str:
    """The tables, with the waited/202 ratios and the command."""
    wait = f"wait={opts.wait_s}"
    after = os.getloadavg()
    lines = [
        f"== Prefer: {wait} against fire-and-forget (202): {opts.store}, 1 receiver, "
        f"{opts.workers} worker(s) x {opts.lanes} lanes",
        f"load average {load[0]:.1f} before, {after[0]:.1f} after, on {os.cpu_count()} CPUs",
    ]
    if phases:
        lines += [
            f"(a) wrk -t{opts.threads} -d{opts.duration_s}s --timeout 60s, new event ids; each "
            "mode on a fresh receiver, after a warm-up and a drain",
            "    CPU MS/REQ: receiver CPU per accepted request; NET: its idle CPU left out; "
            "WORKER: worker CPU per decided event;",
            "    LANE: accept to decision, from the lanes' histogram (includes queueing); "
            "WRK %: wrk's own CPU, % of one core",
        ]
    by = {(p.mode, p.clients): p for p in phases}
    for c in opts.clients:
        rows = [p for p in phases if p.clients == c]
        if not rows:
            continue
        lines += [
            f"(a) {c} concurrent clients",
            f"{'MODE':<10}{'REQUESTS/S':>12}{'P50 MS':>9}{'P99 MS':>9}{'NOT 2XX':>9}{'TOLD':>8}"
            f"{'CPU MS/REQ':>12}{'NET MS/REQ':>12}{'WORKER MS/EVENT':>17}{'LANE MEAN MS':>14}"
            f"{'LANE P50 MS':>13}{'LANE P99 MS':>13}{'WRK %':>7}",
        ]
        for p in rows:
            told = "-" if p.mode.startswith("202") else str(p.load.s200)
            lines.append(
                f"{p.mode:<10}{p.per_s:>12,.0f}{p.load.p50_ms:>9.1f}{p.load.p99_ms:>9.1f}"
                f"{p.load.other + p.load.socket_errors:>9}{told:>8}{p.receiver_ms:>12.3f}"
                f"{p.net_receiver_ms:>12.3f}{p.worker_ms:>17.3f}{p.lane.mean_s * 1000:>14.1f}"
                f"{p.lane.p50_s * 1000:>13.1f}{p.lane.p99_s * 1000:>13.1f}"
                f"{p.load.wrk_cpu_s * 100 / max(p.load.elapsed_s, 1e-9):>7.0f}"
            )
    ratios = [
        (c, by[("202", c)], by[(wait, c)], by.get((PACED, c)))
        for c in opts.clients
        if (wait, c) in by
    ]
    if ratios:
        lines += [
            f"(a) {wait} / 202, this run: at the same clients, and (CPU AT SAME RATE) against "
            f"the {PACED} row; target: receiver CPU per request <= 1.5x",
            f"{'CLIENTS':<8}{'RPS RATIO':>11}{'P50 RATIO':>11}{'P99 RATIO':>11}{'CPU RATIO':>11}"
            f"{'NET RATIO':>11}  TARGET{'CPU AT SAME RATE':>18}  TARGET",
        ]
        for c, fire, waited, paced in ratios:
            cpu = waited.receiver_ms / fire.receiver_ms if fire.receiver_ms else 0.0
            same = waited.receiver_ms / paced.receiver_ms if paced and paced.receiver_ms else 0.0
            lines.append(
                f"{c:<8}{_ratio(waited.per_s, fire.per_s):>11}"
                f"{_ratio(waited.load.p50_ms, fire.load.p50_ms):>11}"
                f"{_ratio(waited.load.p99_ms, fire.load.p99_ms):>11}{cpu:>11.2f}"
                f"{_ratio(waited.net_receiver_ms, fire.net_receiver_ms):>11}  "
                + ("met   " if cpu <= 1.5 else "MISSED")
                + (f"{same:>18.2f}  " + ("met" if same <= 1.5 else "MISSED") if paced else "")
            )
    if memory:
        lines += [
            f"(b) memory: K connections opened to a fresh receiver (no worker running), then a "
            f"request with Prefer: wait={HOLD_WAIT_S} sent on each; RSS (VmRSS) before, with "
            "the K connections idle, and while all K wait",
            f"{'WAITING':<8}{'RSS BEFORE MB':>15}{'CONNECTED MB':>14}{'WAITING MB':>12}"
            f"{'KIB PER REQUEST':>17}{'OF WHICH CONNECTION':>21}{'ANSWERED EARLY':>16}",
        ]
        for m in memory:
            lines.append(
                f"{m.waiting:<8}{m.before_kib / 1024:>15.1f}{m.connected_kib / 1024:>14.1f}"
                f"{m.during_kib / 1024:>12.1f}{m.per_request_kib:>17.1f}"
                f"{m.per_connection_kib:>21.1f}{m.answered_early:>16}"
            )
    lines.append(f"reproduce: {command_line(opts)}")
    return "\n".join(lines)


def run(opts: ToldOptions) -> str:
    """(b), then (a); the printed tables."""
    load = os.getloadavg()
    phases: list[Phase] = []
    memory: list[Memory] = []
    bench_opts = BenchOptions(
        opts.store,
        opts.redis_url,
        opts.pg_url,
        events=0,
        concurrency=max(opts.clients),
        keys=(),
        workers=opts.workers,
        lanes=opts.lanes,
        rounds=1,
        only=None,
        keep_temp=opts.keep_temp,
    )
    with INTERRUPTS.installed(), contextlib.ExitStack() as es:
        bench = Bench(bench_opts, es)
        es.callback(bench.terminate_all)  # on the way out: every child stops at once
        store = open_store(bench.store_url)
        es.callback(store.close)
        store.migrate()
        memory = [run_memory(bench, k) for k in opts.waiting]
        workers = start_workers(bench)
        drain(bench, store)  # (b)'s events
        for clients in opts.clients:
            for mode in ("202", f"wait={opts.wait_s}"):
                phases.append(run_phase(bench, store, workers, opts, mode, clients))
            waited_rate = phases[-1].per_s
            phases.append(run_phase(bench, store, workers, opts, PACED, clients, waited_rate))
        say("stopping every process started; removing the namespace and temporary files")
    return render(opts, phases, memory, load)


def _counts(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        counts = tuple(dict.fromkeys(int(v) for v in value.split(",") if v.strip()))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise click.BadParameter("a comma-separated list of positive integers")
    return counts


def _raise_open_files(needed: int) -> None:
    """Raise this process's soft limit of open files (the receivers inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, needed))
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if want < needed:
        raise click.UsageError(f"{needed} open files needed; the hard limit is {hard}")


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, help=__doc__)
@click.option("--store", type=click.Choice(["sqlite", "postgres"]), default="sqlite")
@click.option("--redis-url", default="redis://127.0.0.1:6379/0", show_default=True)
@click.option(
    "--pg-url",
    default="postgresql://postgres@127.0.0.1:5432/test",
    envvar="KEYLANE_TEST_PG_URL",
    show_default=True,
)
@click.option("--workers", type=click.IntRange(1, 8), default=None, help="[1 on SQLite, else 2]")
@click.option("--lanes", type=click.IntRange(1, 256), default=16, show_default=True)
@click.option(
    "--duration", "duration_s", type=click.IntRange(1, 600), default=10, show_default=True
)
@click.option("--clients", default="32,512", show_default=True, callback=_counts)
@click.option("--wait", "wait_s", type=click.IntRange(1, 30), default=10, show_default=True)
@click.option("--waiting", default="1000,5000", show_default=True, callback=_counts)
@click.option("--threads", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--keep-temp", is_flag=True, help="Keep the temporary directory (logs, SQLite).")
def main(
    store: str,
    redis_url: str,
    pg_url: str,
    workers: int | None,
    lanes: int,
    duration_s: int,
    clients: tuple[int, ...],
    wait_s: int,
    waiting: tuple[int, ...],
    threads: int,
    keep_temp: bool,
) -> None:
    """Entry point (see the module docstring)."""
    opts = ToldOptions(
        store,
        redis_url,
        pg_url,
        worker_processes(store, workers),
        lanes,
        duration_s,
        clients,
        wait_s,
        waiting,
        threads,
        keep_temp,
    )
    _raise_open_files(max(opts.waiting) + max(opts.clients) + 1000)
    try:
        opts = replace(opts, wrk=ensure_wrk())
        click.echo(run(opts))
    except BenchFailure as exc:
        click.echo(f"bench: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("bench: interrupted; everything it started was stopped", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()

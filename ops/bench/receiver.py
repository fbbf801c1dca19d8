"""Part (a) of the benchmark, the receiver: wrk against the baseline, this tree's
``keylane serve`` with each ``--body`` kind and, with ``--against REV``, that revision's
``keylane serve`` (:mod:`keylane.ops.bench.trees`) with the same kinds, each once a round
for ``--rounds`` rounds; after every keylane run, its 2xx are checked against what Redis
holds in that receiver's namespace.

Both receivers are served alike: ``keylane serve`` on a free port, the same Redis and
settings, the bench's sources file (:mod:`keylane.ops.bench.bodies`), each in a namespace
and store of its own. A kind another revision refuses whole in the warm-up (a tree from
before it read forms, multipart or XML) is left out for it, and the report says so.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from ...routing import ShardMap
from ...routing.redis_keys import RedisKeys
from ..embedded_redis import free_port
from . import profile
from .bodies import source_of, write_sources
from .phases import start_receiver
from .procs import (
    Bench,
    BenchFailure,
    Child,
    delete_namespace,
    fresh_store_url,
    namespace_of,
    new_namespace,
    redis_cpu_s,
    say,
)
from .receiver_report import BASELINE, CURRENT, ReceiverRun, key_of
from .report import Report
from .trees import Tree, prepare
from .wrk import WrkResult, ensure_wrk, run_wrk

WARMUP_S = 2
#: How long the requests wrk leaves in flight when it stops may take to finish.
IN_FLIGHT_S = 0.5


@dataclass(frozen=True)
class Target:
    """One server and one body kind: one wrk run a round."""

    server: str  # baseline, keylane, or another revision's short hash
    body: str
    proc: Child
    url: str
    #: Where its accepts are counted and queued; None for the baseline, which has none.
    namespace: str | None

    @property
    def key(self) -> str:
        """Its name in the report."""
        return key_of(self.server, self.body)

    @property
    def other_tree(self) -> bool:
        """Served by another revision (which may refuse a kind)."""
        return self.server not in (BASELINE, CURRENT)


def run_receiver_phase(bench: Bench, report: Report) -> None:
    """(a): every target once a round, ``rounds`` times, the order shifted by one each
    round; each run checked, each round's events then deleted."""
    opts = bench.opts
    bench.wrk = ensure_wrk()
    other = prepare(opts.against) if opts.against else None  # minutes the first time
    # The receivers of (a), and of (b) after it, read the bench's sources.
    bench.env["KEYLANE_SOURCES_FILE"] = str(write_sources(bench.tmp))
    receiver, url = start_receiver(bench)
    baseline, base_url = _start_baseline(bench)
    targets = [Target(BASELINE, "json", baseline, f"{base_url}/webhooks/bench", None)]
    targets += _targets(CURRENT, receiver, url, bench.namespace, opts.bodies)
    if other is not None:
        targets += _targets(other.label, *_start_other(bench, other), opts.bodies)
    targets = _warm(bench, targets, report)
    for round_no in range(opts.rounds):
        shift = round_no % len(targets)
        for target in targets[shift:] + targets[:shift]:
            say(
                f"(a) round {round_no + 1}/{opts.rounds}: wrk -t1 -c{opts.concurrency} "
                f"-d{opts.duration_s}s against {target.key}"
            )
            run = _measure(bench, target, round_no)
            say(
                f"(a)   {target.key}: {run.load.per_s:.0f} requests/s, p99 {run.load.p99_ms:.1f} ms"
            )
            report.receiver.rounds.append(run)
            # A round leaves ~100 MB queued.
            delete_namespace(bench.redis, target.namespace or bench.namespace)
    for proc in {t.proc.pid: t.proc for t in targets if t.proc is not receiver}.values():
        proc.stop()
    if opts.profile:
        body = opts.bodies[0]
        report.receiver.profile = _profile_receiver(
            bench, receiver, f"{url}/webhooks/{source_of(body)}", body
        )
    # Phase (b) starts from an empty namespace: no queued events, no dedupe marks.
    delete_namespace(bench.redis, bench.namespace)


def _targets(
    server: str, proc: Child, url: str, namespace: str, bodies: tuple[str, ...]
) -> list[Target]:
    return [
        Target(server, body, proc, f"{url}/webhooks/{source_of(body)}", namespace)
        for body in bodies
    ]


def _start_baseline(bench: Bench) -> tuple[Child, str]:
    """The bare Starlette app (:mod:`keylane.ops.bench.baseline`) and its URL."""
    port = free_port()
    baseline = bench.start(
        "baseline",
        [
            sys.executable,
            "-m",
            "keylane.ops.bench.baseline",
            "--port",
            str(port),
            "--redis-url",
            bench.opts.redis_url,
            "--key",
            f"{bench.namespace}:baseline",
        ],
    )
    url = f"http://127.0.0.1:{port}"
    bench.wait_http(baseline, f"{url}/healthz")
    return baseline, url


def _start_other(bench: Bench, tree: Tree) -> tuple[Child, str, str]:
    """``keylane serve`` of another revision, with the run's settings but a namespace, a
    store and a data directory of its own: the process, its URL and its namespace."""
    opts = bench.opts
    namespace = bench.es.enter_context(namespace_of(bench.redis, new_namespace()))
    store_url = bench.es.enter_context(
        fresh_store_url(opts.store, bench.tmp, opts.pg_url, f"tree_{tree.label}")
    )
    env = {
        **bench.env,
        "KEYLANE_NAMESPACE": namespace,
        "KEYLANE_STORE_URL": store_url,
        "KEYLANE_DATA_DIR": str(bench.tmp / f"data-{tree.label}"),
    }
    port = free_port()
    argv = tree.keylane_argv("serve", "--port", str(port))
    proc = bench.start(f"receiver-{tree.label}", argv, env, cwd=tree.root)
    url = f"http://127.0.0.1:{port}"
    bench.wait_http(proc, f"{url}/readyz")
    return proc, url, namespace


def _warm(bench: Bench, targets: list[Target], report: Report) -> list[Target]:
    """Each target warmed up for a moment; the targets to measure: all but another
    revision's kinds that it refused whole (noted in the report)."""
    kept = []
    for target in targets:
        load = run_wrk(
            bench.wrk,
            target.url,
            f"warm-{target.server}-{target.body}",
            bench.opts.concurrency,
            WARMUP_S,
            body=target.body,
        )
        if target.other_tree and load.requests and not load.answered_2xx:
            report.receiver.skipped.append(
                f"{target.key}: refused all {load.requests} requests of the warm-up (that "
                f"revision reads no {target.body} bodies); left out of every round"
            )
            continue
        kept.append(target)
    return kept


def _measure(bench: Bench, target: Target, round_no: int) -> ReceiverRun:
    opts = bench.opts
    proc = target.proc
    cpu0, redis0 = proc.cpu_s(), redis_cpu_s(bench.redis)
    before = _accepted_and_queued(bench, target.namespace) if target.namespace else (0, 0)
    tag = f"a{round_no}-{target.server}-{target.body}"
    load = run_wrk(bench.wrk, target.url, tag, opts.concurrency, opts.duration_s, body=target.body)
    run = ReceiverRun(
        target.server,
        load,
        proc.cpu_s() - cpu0,
        redis_cpu_s(bench.redis) - redis0,
        target.body,
        round_no,
    )
    if target.namespace:
        time.sleep(IN_FLIGHT_S)  # the requests wrk left in flight finish
        accepted, queued = _accepted_and_queued(bench, target.namespace)
        _check_accepted(
            target.key, load, accepted - before[0], queued - before[1], opts.concurrency
        )
    return run


def _accepted_and_queued(bench: Bench, namespace: str) -> tuple[int, int]:
    """The accept script's count and the events in the shard queues of ``namespace``,
    read at one instant (MULTI/EXEC: an accept runs wholly before or after)."""
    keys, shards = RedisKeys(namespace), ShardMap(bench.opts.shards)
    pipe = bench.redis.pipeline(transaction=True)
    pipe.hget(keys.counters, "accepted")
    for shard in range(shards.count):
        pipe.llen(keys.queue(shards.queue_name(shard)))
    accepted, *depths = pipe.execute()
    return int(accepted or 0), sum(int(n) for n in depths)


def _check_accepted(
    key: str, load: WrkResult, accepted: int, queued: int, connections: int
) -> None:
    """Every 2xx wrk saw is an event the accept script counted, and every event it
    counted is in a shard queue (wrk stops counting with up to one request in flight per
    connection: those may be accepted without being counted)."""
    if load.status_errors or load.socket_errors:
        raise BenchFailure(
            f"{key} answered {load.status_errors} request(s) with an error "
            f"({load.socket_errors} socket errors)"
        )
    if not load.answered_2xx <= accepted <= load.answered_2xx + connections:
        raise BenchFailure(
            f"{key}: wrk saw {load.answered_2xx} answers but {accepted} were accepted"
        )
    if queued != accepted:
        raise BenchFailure(f"{key}: {accepted} events accepted but {queued} queued")


def _profile_receiver(
    bench: Bench, receiver: Child, url: str, body: str
) -> list[tuple[str, float]]:
    """One more wrk round against the receiver under py-spy (not counted in the figures:
    the profiler takes CPU of its own): where the receiver's time goes."""
    opts = bench.opts
    py_spy = profile.find_py_spy()
    say(f"(a) profile: wrk -d{opts.duration_s}s against keylane under py-spy (not counted)")
    out = bench.tmp / "receiver-profile.txt"
    proc = profile.start(py_spy, receiver.pid, opts.duration_s, out)
    try:
        run_wrk(bench.wrk, url, "profile", opts.concurrency, opts.duration_s, body=body)
    finally:
        found = profile.finish(proc, out)
    delete_namespace(bench.redis, bench.namespace)
    return found

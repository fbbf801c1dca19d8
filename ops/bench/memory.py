"""Redis memory per remembered event: ``python -m keylane.ops.bench.memory --against REV``.

(a) **Per event, before -> after.** For this tree and, with ``--against REV``, that
revision (:mod:`keylane.ops.bench.trees`), each on a Redis server of its own (as ``keylane
up`` embeds it) at its defaults: one receiver and one worker; ``--events`` webhooks over
``--keys`` records sent over HTTP, then drained until the journal holds every event. What
Redis grew by (``INFO memory``'s ``used_memory``, after the drain, less before the first
event) is split in two by deleting the told outcomes (``outcome:*``) and measuring again:
the **marks** (what remembers each id for the dedupe window) and the **told outcomes**.
A told outcome is kept the dedupe window by keylane up to 0.1.x, ``KEYLANE_OUTCOME_KEEP_S``
(an hour) since, so what a remembered event costs at the default window (three days) is
the marks plus the told outcome's share of the window it is kept.

(b) **Sizing.** How many ids share a hash of the marks depends on the rate (``rate x 12 h
/ 2,048`` slots), and so does the hash's encoding (a listpack up to 512 entries). For each
``--rates`` rate, hashes filled to that many ids by the receiver's own Lua
(``producers/gateway/scripts/_seen.lua``) on a fresh server: ``used_memory`` grown per
id. With (a)'s told outcome, the memory of ``rate x window``: the table of the benchmarks
page (ops/docs/benchmarks.md).

Every run is checked: each event answered 202, the journal holds each once. Stops every
process it starts; the servers and their files are removed at the end.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from importlib import resources
from typing import Any

import click
import redis

from ...routing.contract.redis_scripts import lua_constants
from ...routing.redis_keys import SEEN_PERIOD_MS, SEEN_SLOTS, RedisKeys
from ...workers.stores import open_store
from ..embedded_redis import free_port
from .e2e import workload
from .load import run_load
from .phases import wait_owned
from .procs import INTERRUPTS, Bench, BenchFailure, BenchOptions, keylane_argv, say, wait_for
from .trees import Tree, prepare
from .trickle import own_redis

THREE_DAYS_S = 3 * 24 * 3600
DAY_S = 24 * 3600
#: What keylane keeps a told outcome now (``KEYLANE_OUTCOME_KEEP_S``'s default).
OUTCOME_KEEP_S = 3600
#: Ids written per hash density in (b), in all (spread over as many hashes as that takes).
SIZING_IDS = 200_000
#: The settings a Bench pins for its throughput parts, left at their defaults here.
PINNED = ("KEYLANE_BATCH_MAX", "KEYLANE_SHARD_HIGH_WATER", "KEYLANE_GLOBAL_HIGH_WATER")


@dataclass(frozen=True)
class TreeMemory:
    """(a) for one tree: bytes per event of the marks and of the told outcomes."""

    tree: str
    events: int
    marks_b: float
    told_b: float
    #: How long the tree keeps a told outcome, in seconds.
    told_kept_s: int
    #: Redis commands per event from the first POST to the end of the drain (every
    #: process's, ``INFO commandstats``), and of them ``HGET`` (the ids' lookups).
    commands: float
    hgets: float
    #: After the drain: each family of keys (the name after the namespace, up to its
    #: next ``:``) -> keys, and bytes per event of their ``MEMORY USAGE``.
    families: dict[str, tuple[int, float]]

    def at_window(self, window_s: int = THREE_DAYS_S) -> float:
        """Bytes per remembered event, the window's steady state: every id of the window
        remembered, the outcomes of the last ``told_kept_s`` kept."""
        return self.marks_b + self.told_b * min(self.told_kept_s, window_s) / window_s


@dataclass(frozen=True)
class Density:
    """(b) for one rate: ids a hash holds at that rate, bytes per id there."""

    rate: float
    ids_per_hash: int
    per_id_b: float
    encoding: str


def ids_per_hash(rate: float) -> int:
    """How many ids one hash of the marks holds at ``rate`` events/s (of one source)."""
    return max(1, round(rate * SEEN_PERIOD_MS / 1000 / SEEN_SLOTS))


def used_memory(client: redis.Redis) -> int:
    """Redis's ``used_memory``, in bytes."""
    memory: Any = client.info("memory")  # (an Awaitable too before redis-py 8)
    return int(memory["used_memory"])


def measure_tree(opts: BenchOptions, tree: Tree | None, events: int, keys: int) -> TreeMemory:
    """(a) for ``tree`` (None: this checkout) on a server of its own."""
    label = "this tree" if tree is None else tree.label
    with ExitStack() as es:
        server = own_redis(es)
        bench = Bench(replace(opts, redis_url=server.url), es)
        bench.env = {k: v for k, v in bench.env.items() if k not in PINNED}
        client = bench.redis
        url = _start(bench, tree)
        time.sleep(2)
        before = used_memory(client)
        calls0 = command_calls(client)
        work = workload("m", events, keys)
        say(f"(a) {label}: {events} events over {keys} keys")
        load = run_load(f"{url}/webhooks/demo", work.bodies, opts.concurrency)
        if load.accepted != events:
            raise BenchFailure(f"{label}: {load.accepted} of {events} answered 202")
        store = open_store(bench.store_url)
        es.callback(store.close)
        wait_for(
            lambda: store.journal_size() >= events,
            120 + events / 50,
            f"{events} journal entries",
            bench.logs_tail,
            0.2,
        )
        if store.journal_size() != events:
            raise BenchFailure(f"{label}: the journal holds {store.journal_size()} of {events}")
        time.sleep(2)
        after = used_memory(client)
        calls = command_calls(client)
        calls.subtract(calls0)
        families = key_families(client, bench.namespace, events)
        prefix = RedisKeys(bench.namespace).outcome("", "")[:-1]  # "<ns>:outcome:"
        told = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if len(told) != events:
            raise BenchFailure(f"{label}: {len(told)} told outcomes in Redis for {events}")
        for at in range(0, len(told), 1000):
            client.delete(*told[at : at + 1000])
        forgotten = used_memory(client)
        bench.terminate_all()
    kept_s = THREE_DAYS_S if tree is not None else OUTCOME_KEEP_S
    return TreeMemory(
        label,
        events,
        (forgotten - before) / events,
        (after - forgotten) / events,
        kept_s,
        sum(calls.values()) / events,
        calls["hget"] / events,
        families,
    )


def command_calls(client: redis.Redis) -> Counter[str]:
    """Redis's calls so far by command (``INFO commandstats``)."""
    stats: Any = client.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})


def key_families(client: redis.Redis, namespace: str, events: int) -> dict[str, tuple[int, float]]:
    """The namespace's keys by family: how many, and their ``MEMORY USAGE`` per event."""
    found: dict[str, tuple[int, int]] = {}
    for key in client.scan_iter(match=f"{namespace}:*", count=1000):
        family = key.decode()[len(namespace) + 1 :].split(":", 1)[0]
        keys, size = found.get(family, (0, 0))
        usage: Any = client.memory_usage(key, samples=0)
        found[family] = (keys + 1, size + int(usage or 0))
    return {family: (keys, size / events) for family, (keys, size) in sorted(found.items())}


def _start(bench: Bench, tree: Tree | None) -> str:
    """``tree``'s receiver and one worker; the receiver's URL once every shard is owned."""
    port = free_port()
    serve = ("serve", "--port", str(port), "--ops-port", "0")
    if tree is None:
        receiver = bench.start("receiver", keylane_argv(*serve))
        worker = bench.start("worker", keylane_argv("worker"))
    else:
        receiver = bench.start("receiver", tree.keylane_argv(*serve), cwd=tree.root)
        worker = bench.start("worker", tree.keylane_argv("worker"), cwd=tree.root)
    url = f"http://127.0.0.1:{port}"
    bench.wait_http(receiver, f"{url}/readyz")
    wait_owned(bench, [worker])
    return url


def measure_density(client: redis.Redis, rate: float) -> Density:
    """(b) for ``rate``: :data:`SIZING_IDS` ids in hashes of :func:`ids_per_hash` each,
    written by the receiver's Lua, on an empty server."""
    client.flushall()
    per_hash = ids_per_hash(rate)
    hashes = max(1, SIZING_IDS // per_hash)
    mark = client.register_script(_marking_lua())
    before = used_memory(client)
    written = 0
    for h in range(hashes):
        for start in range(0, per_hash, 1000):
            n = min(1000, per_hash - start)
            args: list[bytes | int] = [THREE_DAYS_S * 1000]
            for _ in range(n):
                args += [os.urandom(8), os.urandom(8)]
            mark(keys=[f"sizing:{h}:"], args=args)
            written += n
    grown = used_memory(client) - before
    encoding: Any = client.object("encoding", f"sizing:{0}:{_period_of_now(client)}:0")
    client.flushall()
    return Density(rate, per_hash, grown / written, (encoding or b"?").decode())


def _period_of_now(client: redis.Redis) -> int:
    now: Any = client.time()
    seconds, micros = now
    return int((seconds * 1000 + micros // 1000) // SEEN_PERIOD_MS)


def _marking_lua() -> str:
    """``_seen.lua``'s ``seen_mark`` for each (field, body) pair of ARGV after the window,
    into slot 0 of prefix ``KEYS[1]``."""
    helper = (
        resources.files("keylane.producers.gateway").joinpath("scripts", "_seen.lua").read_text()
    )
    call = (
        "local now = now_ms()\n"
        "for i = 2, #ARGV, 2 do\n"
        "  seen_mark(KEYS[1], '0', ARGV[i], ARGV[i + 1], tonumber(ARGV[1]), now)\n"
        "end\n"
    )
    return f"{lua_constants()}{helper}\n{call}"


def sizing_mb(rate: float, window_s: int, density: Density, told_b: float, kept_s: int) -> float:
    """Redis memory (MB) for a source at ``rate`` events/s and a ``window_s`` window."""
    marks = rate * window_s * density.per_id_b
    told = rate * min(kept_s, window_s) * told_b
    return (marks + told) / 1e6


def report(runs: list[TreeMemory], densities: list[Density]) -> None:
    """The tables: (a) side by side with ratios to the first, (b) per-id and sizing."""
    base = runs[-1]
    print("\n(a) Redis bytes per event, after the drain (used_memory grown / events)")
    print(
        f"{'tree':>10} {'marks':>8} {'told':>8} {'told kept':>10} "
        f"{'per event @3d':>14} {'ratio':>7}"
    )
    for run in runs:
        kept = "3 days" if run.told_kept_s == THREE_DAYS_S else f"{run.told_kept_s}s"
        ratio = run.at_window() / base.at_window()
        print(
            f"{run.tree:>10} {run.marks_b:>8.0f} {run.told_b:>8.0f} {kept:>10} "
            f"{run.at_window():>14.0f} {ratio:>6.2f}x"
        )
    for run in runs:
        print(
            f"  {run.tree}: Redis commands per event {run.commands:.1f} "
            f"(HGET {run.hgets:.1f}), accept and drain"
        )
    for run in runs:
        parts = ", ".join(
            f"{family} {keys} keys {per:.0f} B" for family, (keys, per) in run.families.items()
        )
        print(f"  {run.tree}: MEMORY USAGE per event by key family: {parts}")
    now = runs[0]
    print("\n(b) the marks by rate (one source): ids per hash, bytes per id, encoding")
    for d in densities:
        print(f"{d.rate:>8g}/s {d.ids_per_hash:>8} {d.per_id_b:>8.1f} B  {d.encoding}")
    print(
        "\nsizing (MB of Redis): rate x window, marks + told outcomes kept "
        f"{OUTCOME_KEEP_S}s ({now.told_b:.0f} B each)"
    )
    windows = (("1 day", DAY_S), ("3 days", THREE_DAYS_S), ("7 days", 7 * DAY_S))
    print(f"{'rate':>10} " + " ".join(f"{name:>10}" for name, _ in windows))
    for d in densities:
        cells = [sizing_mb(d.rate, w, d, now.told_b, now.told_kept_s) for _, w in windows]
        print(f"{d.rate:>8g}/s " + " ".join(f"{mb:>10,.0f}" for mb in cells))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--events", default=20_000, show_default=True, help="Events sent per tree.")
@click.option("--keys", default=10_000, show_default=True, help="Records they spread over.")
@click.option("--against", default=None, help="A git revision measured the same way.")
@click.option(
    "--rates", default="10,100,1000", show_default=True, help="Events/s for the sizing table."
)
@click.option("--concurrency", default=32, show_default=True, help="Concurrent senders.")
@click.option("--json", "as_json", is_flag=True, help="Also print the results as one JSON line.")
def main(
    events: int, keys: int, against: str | None, rates: str, concurrency: int, as_json: bool
) -> None:
    """Redis memory per remembered event, this tree against --against REV, and the sizing
    table (see the module docstring)."""
    opts = BenchOptions(
        store="sqlite",
        redis_url="",
        pg_url="",
        events=events,
        concurrency=concurrency,
        keys=(keys,),
        workers=1,
        lanes=0,
        rounds=1,
        only="memory",
        keep_temp=False,
    )
    try:
        with INTERRUPTS.installed(), ExitStack() as es:
            other = prepare(against) if against else None
            runs = [measure_tree(opts, None, events, keys)]
            if other is not None:
                runs.append(measure_tree(opts, other, events, keys))
            server = own_redis(es)
            client = redis.Redis.from_url(server.url)
            es.callback(client.close)
            client.config_set("appendonly", "no")  # no fsync per call: same memory, faster
            densities = [measure_density(client, float(r)) for r in rates.split(",")]
    except BenchFailure as exc:
        say(f"FAILED: {exc}")
        raise SystemExit(1) from None
    report(runs, densities)
    if as_json:
        print(
            json.dumps(
                {"trees": [asdict(r) for r in runs], "sizing": [asdict(d) for d in densities]}
            )
        )


if __name__ == "__main__":
    main()

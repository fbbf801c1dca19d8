"""What the benchmark starts and must clean up: child processes, a Redis namespace and
stores (a SQLite file in its temporary directory, or a PostgreSQL schema of its own).

Each resource is created through a context manager and registered on one
:class:`contextlib.ExitStack` (:class:`Bench`), so a failure, Ctrl-C or SIGTERM at any
point still stops each child (by its pid) and removes each thing created, in reverse order.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import click
import psycopg
import redis
from psycopg import sql

#: The repository root (``ops/bench/`` is two levels down). Children start here, so
#: ``python -m keylane...`` runs this checkout's code, not whichever one is installed.
REPO = Path(__file__).resolve().parents[2]
STOP_GRACE_S = 30.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class BenchFailure(RuntimeError):
    """The benchmark could not run, or a run broke an invariant."""


class Interrupts:
    """SIGINT, SIGTERM and SIGHUP become one :class:`KeyboardInterrupt`, so the exit stack
    unwinds and cleans up; later signals are ignored, so they cannot cut the cleanup
    short. Inside :meth:`critical` (a child started but not yet registered for cleanup)
    a signal waits until the section ends."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self._depth = 0
        self._pending: int | None = None
        self._fired = False

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self._fired:
            return
        if self._depth:
            self._pending = signum
            return
        self._fire(signum)

    def _fire(self, signum: int) -> None:
        self._fired = True
        raise KeyboardInterrupt(signal.Signals(signum).name)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Handle the signals while the block runs."""
        previous = {s: signal.signal(s, self._handler) for s in self.SIGNALS}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """Defer signals until the block is done."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if not self._depth and self._pending is not None and not self._fired:
            self._fire(self._pending)


INTERRUPTS = Interrupts()


@dataclass
class Child:
    """One process the benchmark started, with its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    terminated: bool = False

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    def alive(self) -> bool:
        """Still running."""
        return self.process.poll() is None

    def cpu_s(self) -> float:
        """User plus system CPU seconds used so far (Linux ``/proc``; 0 elsewhere)."""
        return cpu_s_of(self.pid)

    def tree_cpu_s(self) -> float:
        """:meth:`cpu_s` plus that of its live descendants (a prefork pool's children)."""
        return sum(cpu_s_of(pid) for pid in descendants(self.pid)) + self.cpu_s()

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM, once): a worker then finishes its in-flight events."""
        if self.alive() and not self.terminated:
            self.terminated = True
            self.process.send_signal(signal.SIGTERM)  # a no-op once it has been reaped

    def stop(self, timeout_s: float = STOP_GRACE_S) -> None:
        """SIGTERM, wait, then SIGKILL; always reaps."""
        if self.alive():
            self.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        else:
            self.process.wait(10)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of what it wrote."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def cpu_s_of(pid: int) -> float:
    """User plus system CPU seconds process ``pid`` has used (Linux ``/proc``; 0 elsewhere)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # Fields after the parenthesised command name; utime and stime are 14th and 15th.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy, all cores (Linux ``/proc/stat``; 0
    elsewhere): user, nice, system, irq, softirq and steal time."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in first[1:9])
    return (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS


def cpu_s_by_command(commands: Sequence[str]) -> dict[str, float]:
    """CPU seconds used so far by every process whose command name is one of
    ``commands`` (``beam.smp``, ``postgres``, ...), summed per name (Linux ``/proc``; 0
    elsewhere). Processes of other users count too: a server run by the system's user."""
    found = dict.fromkeys(commands, 0.0)
    for stat_path in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = stat_path.read_text()
        except OSError:
            continue
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        if name in found:
            fields = stat.rsplit(")", 1)[1].split()
            found[name] += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return found


def descendants(pid: int) -> list[int]:
    """The live descendants of ``pid`` (Linux ``/proc``; none elsewhere)."""
    out: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(k) for k in task.read_text().split()]
            except OSError:
                continue
            out += kids
            pending += kids
    return out


@contextlib.contextmanager
def child(
    name: str, argv: list[str], env: dict[str, str], log_dir: Path, cwd: Path = REPO
) -> Iterator[Child]:
    """Start ``argv`` in ``cwd`` (output to ``<log_dir>/<name>.log``); stop it on exit."""
    log_path = log_dir / f"{name}.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True
        )
    proc = Child(name, process, log_path)
    try:
        yield proc
    finally:
        proc.stop()


def keylane_argv(*args: str) -> list[str]:
    """``keylane ARGS`` run with this interpreter."""
    return [sys.executable, "-m", "keylane.ops.cli", *args]


def child_env(values: dict[str, str]) -> dict[str, str]:
    """This environment without any ``KEYLANE_*`` or Sentry setting, plus ``values``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("KEYLANE_") and k != "SENTRY_DSN"
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(values)
    return env


def wait_for(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    detail: Callable[[], str] = lambda: "",
    interval_s: float = 0.05,
) -> float:
    """Poll until ``predicate`` holds; the time it first held (``perf_counter``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.perf_counter()
        time.sleep(interval_s)
    raise BenchFailure(f"timed out after {timeout_s:.0f}s waiting for {what}\n{detail()}")


# -- Redis ----------------------------------------------------------------------------------


def new_namespace() -> str:
    """A namespace no one else uses."""
    return f"klbench-{uuid.uuid4().hex[:10]}"


def delete_namespace(client: redis.Redis, namespace: str) -> int:
    """Delete every key of ``namespace`` (never anything else); how many there were."""
    keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])
    return len(keys)


@contextlib.contextmanager
def namespace_of(client: redis.Redis, namespace: str) -> Iterator[str]:
    """``namespace``, whose keys are deleted on exit."""
    try:
        yield namespace
    finally:
        delete_namespace(client, namespace)


def redis_cpu_s(client: redis.Redis) -> float:
    """CPU seconds the Redis server has used (all of its clients, not just ours)."""
    info: Any = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def redis_profile(client: redis.Redis) -> dict[str, str]:
    """Version and persistence settings: they decide what an enqueue costs."""
    server: Any = client.info("server")
    out = {"version": str(server["redis_version"])}
    for name in ("appendonly", "appendfsync"):
        try:
            config: Any = client.config_get(name)
            value = config.get(name, "?")
        except redis.ResponseError:  # CONFIG disabled (managed Redis)
            value = "?"
        out[name] = str(value)
    return out


# -- stores ---------------------------------------------------------------------------------


def _pg_schema_url(base: str, schema: str) -> str:
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}"


@contextlib.contextmanager
def fresh_store_url(kind: str, tmp: Path, pg_url: str, name: str) -> Iterator[str]:
    """The URL of an empty store: a SQLite file under ``tmp`` (removed with it), or a
    PostgreSQL schema of its own (dropped on exit)."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp / f'{name}.sqlite3'}"
        return
    schema = f"klbench_{uuid.uuid4().hex[:10]}_{name}"
    try:
        with psycopg.connect(pg_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    except psycopg.Error as exc:
        raise BenchFailure(f"cannot create a schema in {pg_url}: {exc}") from exc
    try:
        yield _pg_schema_url(pg_url, schema)
    finally:
        with psycopg.connect(pg_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


# -- one run's resources --------------------------------------------------------------------

SHARD_COUNT = 64
MAX_ATTEMPTS = 3


def worker_processes(store: str, *counts: int | None) -> int:
    """The worker processes a run may start (the first of ``counts``, default 1 on SQLite
    and 2 on PostgreSQL); a usage error for several on SQLite, which takes one writer
    process."""
    workers = counts[0] or (1 if store == "sqlite" else 2)
    if store == "sqlite" and max(workers, *(c or 1 for c in counts)) > 1:
        raise click.UsageError(
            "SQLite takes one writer process: use --lanes for more concurrency, or "
            "--store postgres for several worker processes"
        )
    return workers


@dataclass(frozen=True)
class BenchOptions:
    """What to measure, and where."""

    store: str
    redis_url: str
    pg_url: str
    events: int
    concurrency: int
    keys: tuple[int, ...]
    workers: int
    lanes: int
    rounds: int
    only: str | None
    keep_temp: bool
    #: Worker counts for (c); one drain run per count and key count.
    drain_workers: tuple[int, ...] = ()
    #: The deployment's shards (the unit of ownership; lanes bound the records in flight).
    shards: int = SHARD_COUNT
    #: Seconds of wrk load per (a) round and server.
    duration_s: int = 15
    #: Whether (a) ends with a round under py-spy, summed by area of the receiver.
    profile: bool = False
    #: A git revision whose receiver (a) also serves, alternated with this tree's.
    against: str | None = None
    #: (a)'s body kinds (:mod:`keylane.ops.bench.bodies`), each measured every round.
    bodies: tuple[str, ...] = ("json",)


_STARTED = time.monotonic()


def say(message: str) -> None:
    """Progress, on stderr (stdout carries the results)."""
    print(f"[bench {time.monotonic() - _STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


class Bench:
    """One benchmark run's resources, each registered on ``es`` as it is created:
    temporary directory, Redis connection and namespace, store, child processes."""

    def __init__(self, opts: BenchOptions, es: contextlib.ExitStack) -> None:
        self.opts = opts
        self.es = es
        self.tmp = Path(tempfile.mkdtemp(prefix="klbench-"))
        es.callback(self._remove_tmp)
        self.logs = self.tmp / "logs"
        self.logs.mkdir()
        self.redis = redis.Redis.from_url(opts.redis_url, socket_timeout=10)
        es.callback(self.redis.close)
        try:
            self.redis.ping()
        except redis.RedisError as exc:
            raise BenchFailure(f"Redis at {opts.redis_url} does not answer: {exc}") from exc
        self.namespace = es.enter_context(namespace_of(self.redis, new_namespace()))
        self.store_url = es.enter_context(
            fresh_store_url(opts.store, self.tmp, opts.pg_url, "lanes")
        )
        self.env = child_env(
            {
                "KEYLANE_REDIS_URL": opts.redis_url,
                "KEYLANE_NAMESPACE": self.namespace,
                "KEYLANE_STORE_URL": self.store_url,
                "KEYLANE_DATA_DIR": str(self.tmp / "data"),
                "KEYLANE_SHARD_COUNT": str(opts.shards),
                "KEYLANE_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
                "KEYLANE_LOG_LEVEL": "WARNING",
                # One event per write, so a record's revision counts its events and the
                # check sees each event's place: a sender faster than the lanes would
                # otherwise let a lane write a record's queued events together.
                "KEYLANE_BATCH_MAX": "1",
                # Part (a) leaves every event queued (some 100,000 a round on a fast
                # machine); keep the shard and global limits out of its way.
                "KEYLANE_SHARD_HIGH_WATER": str(1_000_000),
                "KEYLANE_GLOBAL_HIGH_WATER": str(100_000_000),
            }
        )
        self.children: list[Child] = []
        self.receiver: Child | None = None
        self.receiver_url = ""
        self.wrk = ""  # the wrk binary, found (or installed) by part (a)

    def _remove_tmp(self) -> None:
        if self.opts.keep_temp:
            say(f"kept {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def start(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        es: contextlib.ExitStack | None = None,
        cwd: Path = REPO,
    ) -> Child:
        """Start a child (with ``env``, default :attr:`env`, in ``cwd``, default this
        checkout) that is stopped when ``es`` (default: the whole run's stack) unwinds, or
        earlier, by the caller."""
        with INTERRUPTS.critical():
            stack = self.es if es is None else es
            proc = stack.enter_context(
                child(name, argv, self.env if env is None else env, self.logs, cwd)
            )
            self.children.append(proc)
        return proc

    def wait_http(self, proc: Child, url: str) -> None:
        """Wait until ``url`` answers 200; fail if ``proc`` exits first."""
        from .load import get_ok

        wait_for(lambda: get_ok(url) or not proc.alive(), 30, f"{proc.name} at {url}")
        if not proc.alive():
            raise BenchFailure(f"{proc.name} exited:\n{proc.log_tail()}")

    def terminate_all(self) -> None:
        """SIGTERM every child at once, so they stop in parallel (each is then awaited
        by the exit stack)."""
        for proc in self.children:
            proc.terminate()

    def stop_all(self) -> None:
        """Stop every child now, in parallel: SIGTERM all, then await each."""
        self.terminate_all()
        for proc in self.children:
            proc.stop()
        self.receiver = None

    def logs_tail(self) -> str:
        """The end of every child's log, for failure messages."""
        return "\n".join(
            f"--- {c.name} (pid {c.pid}, alive={c.alive()})\n{c.log_tail()}" for c in self.children
        )

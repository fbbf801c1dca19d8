"""Real keylane processes for end-to-end tests: receivers and workers as subprocesses,
real HTTP, real signals. Every process a test starts is stopped when the test ends."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from keylane.ops.deployment_view import DeploymentView
from keylane.routing.contract.settings import Settings
from keylane.routing.contract.settings_env import env_var, settings_environ
from keylane.workers.brokers.redis import RedisLaneBroker
from keylane.workers.stores import open_store
from keylane.workers.stores.sql import SqlStore
from tests.support.services import free_port

REPO = Path(__file__).resolve().parents[2]

#: The receiver's lines that name the ports it listens on: webhooks, operations.
LISTENING = re.compile(r"receiver listening on http://[^:]+:(\d+)")
OPS_LISTENING = re.compile(r"operations listening on http://[^:]+:(\d+)")


def settings_env(settings: Settings, **extra: Any) -> dict[str, str]:
    """The environment that makes a keylane process use ``settings`` (and ``extra``
    settings on top)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYLANE_")}
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(settings_environ(settings))
    for name, value in extra.items():
        if value is not None:
            env[env_var(name)] = json.dumps(value) if isinstance(value, list | dict) else str(value)
    return env


@dataclass
class Proc:
    """One keylane subprocess with its log file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    cwd: Path = REPO  # another for a release installed elsewhere: the checkout shadows it

    def start(self) -> Proc:
        """Start it (output to the log file)."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        """Still running."""
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        """Send a signal if it runs."""
        if self.alive():
            os.kill(self.pid, signum)

    def kill(self) -> None:
        """``kill -9``, then reap."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            assert self.process is not None
            self.process.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait (SIGKILL after ``timeout_s``); the exit code."""
        if self.process is None:
            return None
        if self.alive():
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode

    def log(self) -> str:
        """Everything it wrote so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Stack:
    """A test deployment: the processes of one namespace, plus helpers to drive it."""

    settings: Settings
    tmp: Path
    procs: list[Proc] = field(default_factory=list)
    url: str = ""
    ops_url: str = ""  # the last receiver's operations listener (/metrics)
    stores: list[SqlStore] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. signing secrets
    http: httpx.Client | None = None
    _http_lock: threading.Lock = field(default_factory=threading.Lock)

    def _spawn(self, name: str, args: list[str], **env: Any) -> Proc:
        n = sum(1 for p in self.procs if p.name.startswith(name))
        proc = Proc(
            f"{name}-{n}",
            [sys.executable, "-m", "keylane.ops.cli", *args],
            {**settings_env(self.settings, **env), **self.extra_env},
            self.tmp / f"{name}-{n}.log",
        )
        self.procs.append(proc.start())
        return proc

    def worker(self, lanes: int = 4, **env: Any) -> Proc:
        """Start a worker process."""
        return self._spawn("worker", ["worker", "--lanes", str(lanes)], **env)

    def scheduler(self, **env: Any) -> Proc:
        """Start a scheduler process (scheduled jobs and repair sweeps) and wait until it
        has registered its jobs."""
        proc = self._spawn("scheduler", ["scheduler"], **env)
        wait_until(lambda: "job(s):" in proc.log() or not proc.alive(), 60, "scheduler to start")
        assert proc.alive(), proc.log()
        return proc

    def writers(self, wanted: int) -> int:
        """How many worker processes a test that wants ``wanted`` may run at once: SQLite
        takes one writer process (a second one refuses to start)."""
        return 1 if self.settings.store_is_sqlite else wanted

    def use_sources(self, text: str, **settings: Any) -> Path:
        """Write ``text`` as the deployment's sources file (in its own folder) and point
        the settings at it, with any other ``settings``; processes started after use it."""
        path = self.tmp / "sources.toml"
        path.write_text(text)
        self.settings = self.settings.model_copy(update={"sources_file": path, **settings})
        return path

    def receiver(self, port: int | None = None, **env: Any) -> Proc:
        """Start a receiver and wait until it answers; sets :attr:`url`. Without ``port``
        it listens on one the system picks (read back from its log): no race for ports.
        Its operations listener is on a port the system picks: :attr:`ops_url`."""
        proc = self._spawn(
            "receiver", ["serve", "--port", str(port or 0), "--ops-port", "0"], **env
        )

        def listening() -> bool:
            found = LISTENING.search(proc.log())
            ops = OPS_LISTENING.search(proc.log())
            if found is not None and ops is not None:
                self.url = f"http://127.0.0.1:{found.group(1)}"
                self.ops_url = f"http://127.0.0.1:{ops.group(1)}"
            return (found is not None and ops is not None) or not proc.alive()

        wait_until(listening, 30, "receiver to listen")
        wait_until(lambda: _healthy(self.url) or not proc.alive(), 30, "receiver to start")
        assert proc.alive(), proc.log()
        return proc

    def broker(self) -> RedisLaneBroker:
        """The lanes' Redis broker on this deployment's namespace."""
        s = self.settings
        return RedisLaneBroker.from_url(s.redis_dsn(), s.keys, s.shards)

    def view(self) -> DeploymentView:
        """Read-only views of this deployment in Redis (what ``keylane status`` shows)."""
        s = self.settings
        return DeploymentView.from_url(s.redis_dsn(), s.keys, s.shards)

    def settled_counters(self, timeout_s: float = 30.0) -> dict[str, int]:
        """The deployment's counters once what its receivers and workers counted is
        written: each writes its counts every ``counts_flush_ms``
        (:mod:`keylane.routing.contract.tallies`), so two reads that far apart and more
        agree once nothing is left to write."""
        view = self.view()
        gap_s = 3 * self.settings.counts_flush_ms / 1000
        deadline = time.monotonic() + timeout_s
        last = view.counters()
        while True:
            time.sleep(gap_s)
            now = view.counters()
            if now == last:
                return now
            assert time.monotonic() < deadline, f"the counters still move: {last} -> {now}"
            last = now

    def keylane(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a ``keylane`` command against this deployment."""
        return subprocess.run(
            [sys.executable, "-m", "keylane.ops.cli", *args],
            env={**settings_env(self.settings), **self.extra_env},
            capture_output=True,
            text=True,
            timeout=60,
        )

    def wait_all_owned(self, workers: int | None = None, timeout_s: float = 30) -> None:
        """Wait until every shard has an owner (and, if given, ``workers`` live members
        each owning some)."""
        view = self.view()

        def ready() -> bool:
            holders = view.lease_values()
            if len(holders) < self.settings.shard_count:
                return False
            if workers is None:
                return True
            owners = {h.rsplit("/", 1)[0] for h in holders.values()}
            return len(owners) == workers

        wait_until(
            ready,
            timeout_s,
            f"all shards owned by {workers or 'some'} worker(s)",
            on_timeout=self.logs,
        )

    def open_store(self) -> SqlStore:
        """A connection to the deployment's store (closed when the test ends)."""
        store = open_store(self.settings.store_dsn())
        self.stores.append(store)
        return store

    def wait_journal(self, count: int, timeout_s: float = 120) -> None:
        """Wait until the journal holds ``count`` event ids (the tables made first: the
        workers may not have made them yet)."""
        store = self.open_store()
        store.migrate()
        wait_until(
            lambda: store.journal_size() >= count,
            timeout_s,
            f"{count} journal entries",
            on_timeout=lambda: f"have {store.journal_size()}\n" + self.logs(),
        )

    def post(
        self,
        body: Any,
        source: str = "demo",
        client: httpx.Client | None = None,
        retries: int = 0,
        url: str | None = None,
        **headers: str,
    ) -> httpx.Response:
        """POST a webhook (JSON-encoded ``body``) and return the answer. Without a
        ``client``, one shared by the whole test (and safe across threads) is used."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        hdrs = {"content-type": "application/json", **headers}
        c = client or self._client()
        for attempt in range(retries + 1):
            try:
                return c.post(f"{url or self.url}/webhooks/{source}", content=data, headers=hdrs)
            except httpx.TransportError:
                if attempt == retries:
                    raise
                time.sleep(0.2)
        raise AssertionError("unreachable")

    def _client(self) -> httpx.Client:
        with self._http_lock:  # threads may post at once: one client for all of them
            if self.http is None:
                self.http = httpx.Client(timeout=30)
            return self.http

    def logs(self) -> str:
        """The tail of every process's log, for failure messages."""
        return "\n".join(f"--- {p.name} (alive={p.alive()})\n{p.log()[-3000:]}" for p in self.procs)

    def stop_all(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL)."""
        for proc in reversed(self.procs):
            proc.stop(timeout_s=20)
        for store in self.stores:
            store.close()
        self.stores.clear()
        if self.http is not None:
            self.http.close()
            self.http = None


def start_up(
    args: list[str],
    env: dict[str, str],
    log_path: Path,
    cwd: Path = REPO,
    shell_line: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``keylane up`` (``args`` after ``keylane``, or a whole ``shell_line`` as a
    user types it; output to ``log_path``) in ``cwd`` and wait until it says it is up.
    Its operations listener is on a free port (``KEYLANE_OPS_PORT``; its ``Metrics:``
    line names it) unless ``args`` choose one: tests run side by side."""
    if "--ops-port" not in args:
        env = {**env, "KEYLANE_OPS_PORT": str(free_port())}
    command = (
        ["bash", "-c", shell_line]
        if shell_line is not None
        else [sys.executable, "-m", "keylane.ops.cli", *args]
    )
    with log_path.open("wb") as log:
        up = subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(
            lambda: "keylane is up" in log_path.read_text() or up.poll() is not None,
            60,
            "keylane up",
            on_timeout=log_path.read_text,
        )
        assert up.poll() is None, log_path.read_text()
    except BaseException:
        up.send_signal(signal.SIGTERM)
        up.wait(90)
        raise
    return up


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    on_timeout: Callable[[], str] | None = None,
    interval_s: float = 0.05,
) -> None:
    """Poll ``predicate`` until true; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    detail = on_timeout() if on_timeout else ""
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{detail}")


def send_all(
    stack: Stack, bodies: Iterable[Any], senders: int, source: str = "demo", retries: int = 3
) -> list[httpx.Response]:
    """POST every body with ``senders`` concurrent HTTP clients."""
    items = list(bodies)
    clients = [httpx.Client(timeout=30) for _ in range(senders)]
    try:
        with ThreadPoolExecutor(senders) as pool:
            futures = [
                pool.submit(stack.post, body, source, clients[i % senders], retries)
                for i, body in enumerate(items)
            ]
            return [f.result() for f in futures]
    finally:
        for c in clients:
            c.close()


def event(event_id: str, record_key: str, **changes: Any) -> dict[str, Any]:
    """keylane's envelope for one event."""
    return {"id": event_id, "type": "test", "record_key": record_key, "changes": changes}

"""``keylane up``: the whole stack on one machine, supervised.

Starts (in this order) the embedded Redis when no ``KEYLANE_REDIS_URL`` is set, the
store schema, the shard workers (one on SQLite, which takes one writer process), the
receiver (with its operations listener, ``/metrics``), a scheduler (scheduled jobs,
repair sweeps, keylane's maintenance) and Flower; restarts a child that dies, the
embedded Redis included (on the same port and directory: its append-only file, fsynced
on every write, holds everything it acknowledged), with back-off; on SIGTERM or Ctrl-C
stops the receiver first (no new deliveries) and the scheduler (its runs finish first),
then the workers (each finishes and acknowledges its in-flight messages and releases its
shards), then Flower and Redis.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field

from ..producers.intake import load_hook
from ..producers.signatures import verifiers_of
from ..routing.contract.errors import ConfigError
from ..routing.contract.settings import Settings
from ..routing.contract.settings_env import settings_environ
from ..routing.contract.sources import load_sources
from ..workers.service import check_worker_config
from ..workers.stores import open_store
from .embedded_redis import EmbeddedRedis
from .up_checks import DataDirLock, check_flower_exposure, check_port_free

log = logging.getLogger("keylane.up")

STOP_GRACE_S = 30.0
MAX_RESTART_BACKOFF_S = 30.0


@dataclass
class Child:
    """A supervised process."""

    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    exits: list[int] = field(default_factory=list)

    def exited(self, code: int) -> float:
        """Record an exit; the back-off before the restart (none after a long run)."""
        self.exits.append(code)
        uptime = time.monotonic() - self.started_at
        self.restarts = 0 if uptime > 60 else self.restarts + 1
        if not self.restarts:
            return 0.0
        return min(MAX_RESTART_BACKOFF_S, 0.5 * 2.0 ** (self.restarts - 1))


@dataclass(frozen=True)
class UpOptions:
    """What ``keylane up`` runs."""

    flower: bool = True
    restart: bool = True


class Supervisor:
    """Runs and watches the children of ``keylane up``."""

    def __init__(self, settings: Settings, options: UpOptions) -> None:
        self.settings = settings
        self.options = options
        self.redis: EmbeddedRedis | None = None
        self.redis_child: Child | None = None  # the embedded Redis, when this process runs it
        self.children: list[Child] = []
        self._stop = threading.Event()
        self._lock = DataDirLock(settings.data_dir)
        # Children build the very same settings, whatever came from flags or the environment.
        self._env = {**os.environ, **settings_environ(settings)}

    def run(self) -> int:
        """Check, start everything, supervise until told to stop, stop everything; the
        exit code (1: a child died before the stack was up). A configuration that cannot
        work raises :class:`ConfigError` before anything is started."""
        self._check()
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            self._prepare()
            self._spawn_all()
            if not self._announce():
                return 1
            self._watch()
        finally:
            self._shutdown()
            self._lock.release()
        return 0

    def _on_signal(self, signum: int, frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        self._stop.set()

    def _check(self) -> None:
        """Fail here, once and clearly, rather than in children restarted forever."""
        s = self.settings
        s.worker_process_count()  # refuses several worker processes on SQLite
        sources = load_sources(s)
        verifiers_of(sources, os.environ)
        check_worker_config(s)  # the app's tasks and every destination, before any child
        for source in sources.all():
            load_hook(source)  # the receiver child warns about each source as it starts
        self._lock.acquire()  # one keylane up per data directory
        try:
            check_port_free(s.host, s.port, "the receiver", "--port / KEYLANE_PORT")
            check_port_free(
                s.ops_host,
                s.ops_port,
                "the receiver's operations listener",
                "--ops-port / KEYLANE_OPS_PORT",
            )
            if self.options.flower:
                auth = s.flower_basic_auth is not None
                check_flower_exposure(s.flower_address, auth, os.environ)
                check_port_free(
                    s.flower_address,
                    s.flower_port,
                    "Flower",
                    "--flower-port / KEYLANE_FLOWER_PORT (or --no-flower)",
                )
        except ConfigError:
            self._lock.release()
            raise

    def _prepare(self) -> None:
        s = self.settings
        self._env["KEYLANE_DATA_DIR"] = str(s.data_dir.resolve())
        if s.redis_url is None:
            embedded = EmbeddedRedis(s.data_dir)
            url = embedded.running_url()
            if url is None:
                url = embedded.start()
                self.redis = embedded
                self.redis_child = Child("redis", [], embedded.process, started_at=time.monotonic())
                log.info(
                    "embedded Redis on %s (append-only, fsync always) in %s", url, embedded.dir
                )
            else:
                log.info("using the embedded Redis already running on %s", url)
            self._env["KEYLANE_REDIS_URL"] = url
        store = open_store(s.store_dsn(), s.store_timeout_ms, s.sqlite_synchronous)
        try:
            store.migrate()
        finally:
            store.close()

    def _spawn_all(self) -> None:
        me = [sys.executable, "-m", "keylane.ops.cli"]
        s = self.settings
        for n in range(s.worker_process_count()):
            self.children.append(Child(f"worker-{n}", [*me, "worker"]))
        self.children.append(Child("receiver", [*me, "serve"]))
        self.children.append(Child("scheduler", [*me, "scheduler"]))
        if self.options.flower:
            self.children.append(Child("flower", [*me, "flower"]))
        for child in self.children:
            self._spawn(child)

    def _spawn(self, child: Child) -> None:
        if child is self.redis_child:
            self._restart_redis(child)
            return
        # A new session: Ctrl-C reaches only the supervisor, which stops children in order.
        child.process = subprocess.Popen(child.argv, env=self._env, start_new_session=True)
        child.started_at = time.monotonic()
        log.info("started %s (pid %s)", child.name, child.process.pid)

    def _restart_redis(self, child: Child) -> None:
        """Start the embedded Redis again, on the same port and directory: it reloads its
        append-only file, so every event it acknowledged is there again."""
        assert self.redis is not None
        child.started_at = time.monotonic()
        try:
            self.redis.start()
        except ConfigError as exc:
            log.error("embedded Redis did not come back: %s", exc)
        child.process = self.redis.process
        log.info("restarted the embedded Redis on %s", self.redis.url)

    def _announce(self) -> bool:
        """Wait for this stack's receiver to answer, then say where it is; False when a
        child died while starting (its log is above: a second deployment on the same
        port, a configuration a child refuses), after which everything is stopped."""
        s = self.settings
        base = f"http://{s.host}:{s.port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self._stop.is_set():
            dead = self._dead_children()
            if dead:
                log.error("%s; stopping (see the log above)", dead)
                return False
            if _answers(f"{base}/healthz") and not self._dead_children():
                break
            time.sleep(0.2)
        else:
            if not self._stop.is_set():
                log.error("the receiver did not answer on %s within 30s; see the logs above", base)
            return True
        names = ", ".join(load_sources(s).names())
        print(f"keylane is up: POST {base}/webhooks/<source> (sources: {names})", flush=True)
        print(f"Metrics: http://{s.ops_host}:{s.ops_port}/metrics", flush=True)
        if s.web_view:
            print(f"Web view: http://{s.ops_host}:{s.ops_port}/", flush=True)
        if self.options.flower:
            print(f"Flower: http://{s.flower_address}:{s.flower_port}", flush=True)
        return True

    def _dead_children(self) -> str:
        """Which children have exited, and how (empty: none)."""
        watched = [self.redis_child] if self.redis_child is not None else []
        dead = [
            f"{c.name} exited with {c.process.returncode} while starting"
            for c in watched + self.children
            if c.process is not None and c.process.poll() is not None
        ]
        return "; ".join(dead)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            watched = [self.redis_child] if self.redis_child is not None else []
            for child in watched + self.children:
                assert child.process is not None
                code = child.process.poll()
                if code is None:
                    continue
                log.error("%s (pid %s) exited with %s", child.name, child.process.pid, code)
                _report_exit(child, code)
                if not self.options.restart:
                    self._stop.set()
                    return
                if self._stop.wait(child.exited(code)):
                    return
                self._spawn(child)

    def _shutdown(self) -> None:
        # The scheduler before the workers: its runs' last events still get applied.
        order = ["receiver", "scheduler", "worker", "flower"]
        for prefix in order:
            group = [c for c in self.children if c.name.startswith(prefix)]
            for child in group:
                if child.process is not None and child.process.poll() is None:
                    child.process.send_signal(signal.SIGTERM)
            for child in group:
                _wait_or_kill(child)
        if self.redis is not None:
            self.redis.stop()
        if self.children or self.redis is not None:
            log.info("keylane stopped")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as reply:  # noqa: S310
            return bool(reply.status == 200)
    except OSError:
        return False


def _wait_or_kill(child: Child) -> None:
    if child.process is None:
        return
    try:
        child.process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        log.error("%s did not stop within %ss; killing it", child.name, STOP_GRACE_S)
        child.process.kill()
        child.process.wait()


def _report_exit(child: Child, code: int) -> None:
    """Tell Sentry (when configured) that a child died, e.g. a worker killed by SIGKILL."""
    try:
        import sentry_sdk
    except ImportError:  # pragma: no cover
        return
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    with sentry_sdk.new_scope() as scope:
        scope.set_tag("keylane.child", child.name)
        sentry_sdk.capture_message(f"keylane {child.name} died ({how}); restarting", level="error")


__all__ = ["ConfigError", "Supervisor", "UpOptions"]

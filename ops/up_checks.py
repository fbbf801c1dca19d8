"""What ``keylane up`` checks before it starts any child: that no other ``keylane up`` runs
on its data directory, that the ports its receiver and Flower will listen on are free,
and that Flower is not put beyond loopback without a password. Any failing is a
:class:`ConfigError` that names the problem and the option to change, raised before
anything is started or changed: a second ``keylane up`` would otherwise start children
that die on ``address already in use`` and are restarted forever, while the banner names
ports another deployment answers on.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from ..routing.contract.errors import ConfigError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks; the port check remains
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = "up.lock"


class DataDirLock:
    """An exclusive lock on ``<data dir>/up.lock``, held while ``keylane up`` runs. The
    kernel releases it when the process ends, however it ends, so a crashed supervisor
    never leaves a stale lock behind; the file keeps the holder's pid for the message."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`ConfigError` naming the ``keylane up`` that has it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+")
        if fcntl is not None:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.seek(0)
                holder = handle.read().strip() or "?"
                handle.close()
                raise ConfigError(
                    f"keylane up is already running on the data directory "
                    f"{self.path.parent.resolve()} (pid {holder}): stop that one first, or "
                    "give this one another --data-dir / KEYLANE_DATA_DIR"
                ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle

    def release(self) -> None:
        """Let go of the lock (the file stays; an unlocked file means nothing)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def check_port_free(host: str, port: int, what: str, options: str) -> None:
    """Raise :class:`ConfigError` when nothing of ours could listen on ``host:port``:
    ``what`` names the listener, ``options`` the settings that choose another port."""
    listening_socket(host, port, what, options).close()


def listening_socket(host: str, port: int, what: str, options: str) -> socket.socket:
    """A socket bound to ``host:port`` and listening (port 0: one the system picks), for
    a server to take over; :class:`ConfigError` when it cannot be had, so a taken port
    ends the start at once with one line, before anything else started."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"{what}: cannot resolve the address {host!r}: {exc}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        # As uvicorn and tornado bind: a port whose old connections linger in TIME_WAIT
        # is free for them, so it is free here too.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"{what}: port {port} on {host} is already in use (another keylane up, or "
                f"another program, listens there): stop it, or choose another port with "
                f"{options}"
            ) from None
        raise ConfigError(f"{what}: cannot listen on {host}:{port}: {exc}") from None
    return sock


#: What Flower reads for its own authentication besides ``--basic-auth`` (its options
#: come from ``FLOWER_<NAME>`` variables too): basic auth, or an OAuth provider.
FLOWER_AUTH_VARIABLES = ("FLOWER_BASIC_AUTH", "FLOWER_AUTH_PROVIDER")


def check_flower_exposure(address: str, basic_auth: bool, environ: Mapping[str, str]) -> None:
    """:class:`ConfigError` when Flower would listen beyond loopback without
    authentication: it shows every event's record key and arguments, and can revoke
    tasks and shut workers down, to whoever reaches it."""
    if _loopback(address) or basic_auth or any(environ.get(v) for v in FLOWER_AUTH_VARIABLES):
        return
    raise ConfigError(
        f"Flower on {address} would answer anyone who reaches that address, without a "
        "password: set KEYLANE_FLOWER_BASIC_AUTH=user:password (or Flower's own "
        "FLOWER_BASIC_AUTH / FLOWER_AUTH_PROVIDER), or keep it on 127.0.0.1 "
        "(--address / KEYLANE_FLOWER_ADDRESS)"
    )


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: whatever it resolves to later, not known loopback
        return False

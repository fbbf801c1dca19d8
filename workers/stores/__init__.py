"""Record stores: the interfaces by role (:mod:`keylane.workers.store`), one SQL store
that is all of them (:mod:`keylane.workers.stores.sql`) over a SQLite or PostgreSQL
dialect. Whoever opens a store owns its connection (closes it) and hands its roles on."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from ...routing.contract.errors import ConfigError, StoreMissing
from .sql import SqlStore


def open_store(
    url: str, timeout_ms: int = 5000, sqlite_synchronous: Literal["NORMAL", "FULL"] = "FULL"
) -> SqlStore:
    """Open a store from ``sqlite:///path`` or ``postgresql://...``."""
    scheme = urlparse(url).scheme
    if scheme == "sqlite":
        from .sqlite import SqliteDialect

        path = url[len("sqlite://") :]
        return SqlStore(
            SqliteDialect(Path(path), timeout_ms=timeout_ms, synchronous=sqlite_synchronous)
        )
    if scheme in ("postgres", "postgresql"):
        from .postgres import PostgresDialect

        return SqlStore(PostgresDialect(url, timeout_ms=timeout_ms))
    raise ConfigError(f"unsupported store URL scheme {scheme!r}: use sqlite:/// or postgresql://")


def open_existing_store(
    url: str, timeout_ms: int = 5000, sqlite_synchronous: Literal["NORMAL", "FULL"] = "FULL"
) -> SqlStore:
    """Open a store that a worker (or ``keylane up``) has created, creating nothing: a
    SQLite file that is not there, or a database without keylane's tables, raises
    :class:`StoreMissing` saying where it looked."""
    if urlparse(url).scheme == "sqlite":
        path = Path(url[len("sqlite://") :])
        if not path.is_file():
            shown = str(path)[1:] if str(path).startswith("//") else path  # sqlite:////abs
            raise StoreMissing(f"there is no keylane store at {shown}")
    store = open_store(url, timeout_ms, sqlite_synchronous)
    try:
        if not store.has_schema():
            raise StoreMissing(f"the database of {_where(url)} has no keylane tables")
    except BaseException:
        store.close()
        raise
    return store


def _where(url: str) -> str:
    """A store URL without its password."""
    parts = urlparse(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)

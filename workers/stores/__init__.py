"""Record stores: one interface (:mod:`keylane.workers.store`), one SQL store
(:mod:`keylane.workers.stores.sql`) over a SQLite or PostgreSQL dialect."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from ...routing.contract.errors import ConfigError
from ..store import Store
from .sql import SqlStore


def open_store(
    url: str, timeout_ms: int = 5000, sqlite_synchronous: Literal["NORMAL", "FULL"] = "FULL"
) -> Store:
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

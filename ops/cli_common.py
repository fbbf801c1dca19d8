"""What the ``keylane`` subcommands share: the settings object, store access, output."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import click

from keylane.routing.contract.settings import Settings
from keylane.workers.stores import open_store
from keylane.workers.stores.base import Store


def settings_of(ctx: click.Context) -> Settings:
    """The settings the ``keylane`` group built from its options and the environment."""
    settings = ctx.find_root().obj
    assert isinstance(settings, Settings)
    return settings


def cli_store(settings: Settings) -> Store:
    """A store connection for one command (the schema is created if missing, so a fresh
    data directory reads as empty rather than as an error)."""
    store = open_store(settings.store_dsn(), settings.store_timeout_ms, settings.sqlite_synchronous)
    store.migrate()
    return store


def emit_json(value: Any) -> None:
    """Print ``value`` as indented JSON."""
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def when(ts: float | None) -> str | None:
    """A UTC timestamp for tables."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def age(ts: float, now: float) -> str:
    """How long ago ``ts`` was, briefly (``42s``, ``5m``, ``3h``, ``2d``)."""
    seconds = max(0.0, now - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"

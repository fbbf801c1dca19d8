"""What the ``keylane`` subcommands share: the settings object, store access, output.

Settings are the one source of every default and environment variable: an option that sets
a setting is declared with :func:`setting_option`, which takes its help text's default and
variable from :class:`Settings` and only records what the user typed. The settings object
is built once, when a command first asks for it (:func:`settings_of`), from the
environment and those overrides. The deployment options (``--data-dir``, ``--redis-url``,
``--store-url``, ``--shards``, ``--log-level``, ``--log-format``) are accepted before the
subcommand and after it alike (:func:`accept_deployment_options`).
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..routing.contract.errors import ConfigError, KeylaneError, StoreMissing
from ..routing.contract.logcontext import configure_logging
from ..routing.contract.settings import Settings
from ..routing.contract.settings_env import InvalidSettings, env_var, load_settings
from .embedded_redis import with_embedded_redis

if TYPE_CHECKING:
    from ..workers.stores.sql import SqlStore

F = TypeVar("F", bound=Callable[..., Any])

_OVERRIDES = "keylane.overrides"
_SETTINGS = "keylane.settings"


#: The option of each setting that has one (setting name -> ``--option``), for messages.
FLAGS: dict[str, str] = {}


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is not None and param.name is not None:
        ctx.find_root().meta.setdefault(_OVERRIDES, {})[param.name] = value
    return value


def setting_param(flag: str, field: str, help_text: str, **kwargs: Any) -> click.Option:
    """A command-line option that overrides the setting ``field`` (``flag`` may name
    several spellings: ``"-A --app"``); its help shows the default and the environment
    variable, both from :class:`Settings`."""
    default = Settings.model_fields[field].default
    shown = "none" if default is None else str(default)
    FLAGS.setdefault(field, next(f for f in flag.split() if f.startswith("--")))
    return click.Option(
        [*flag.split(), field],
        default=None,
        expose_value=False,
        callback=_remember,
        help=f"{help_text} [default: {shown}; env {env_var(field)}]",
        **kwargs,
    )


def setting_option(flag: str, field: str, help_text: str, **kwargs: Any) -> Callable[[F], F]:
    """:func:`setting_param` as a decorator."""

    def decorate(fn: F) -> F:
        params = getattr(fn, "__click_params__", [])
        params.append(setting_param(flag, field, help_text, **kwargs))
        fn.__click_params__ = params  # type: ignore[attr-defined]
        return fn

    return decorate


def deployment_params() -> list[click.Option]:
    """The options every command accepts: which deployment, and how to log."""
    return [
        setting_param(
            "--data-dir",
            "data_dir",
            "Data directory (SQLite store, embedded Redis).",
            type=click.Path(path_type=Path),
        ),
        setting_param(
            "--redis-url", "redis_url", "Redis URL; none: the data directory's embedded Redis."
        ),
        setting_param(
            "--store-url",
            "store_url",
            "sqlite:///path or postgresql://...; none: SQLite in the data directory.",
        ),
        setting_param(
            "--shards", "shard_count", "Shard count (fixed for the life of a deployment).", type=int
        ),
        setting_param("--log-level", "log_level", "Log level."),
        setting_param(
            "--log-format", "log_format", "Log lines.", type=click.Choice(["text", "json"])
        ),
    ]


def accept_deployment_options(command: click.Command) -> None:
    """Let every subcommand of ``command`` (or ``command`` itself, if it has none) take
    the deployment options too, so that ``keylane status --data-dir D`` works as well as
    ``keylane --data-dir D status``."""
    for leaf in _leaves(command):
        leaf.params.extend(deployment_params())


def _leaves(command: click.Command) -> Iterator[click.Command]:
    if isinstance(command, click.Group):
        for subcommand in command.commands.values():
            yield from _leaves(subcommand)
    else:
        yield command


def settings_of(ctx: click.Context) -> Settings:
    """The settings of this invocation: environment and ``KEYLANE_*`` defaults, overridden
    by the options given (built once; logging is configured from them)."""
    root = ctx.find_root()
    if _SETTINGS not in root.meta:
        try:
            settings = with_embedded_redis(load_settings(**root.meta.get(_OVERRIDES, {})))
        except InvalidSettings as exc:
            raise ConfigError(exc.describe(FLAGS)) from None
        configure_logging(settings.log_level, settings.log_format)
        root.meta[_SETTINGS] = settings
    settings = root.meta[_SETTINGS]
    assert isinstance(settings, Settings)
    return settings


def cli_store(settings: Settings) -> SqlStore:
    """The deployment's store, for one command: the command owns the connection (closes
    it) and hands each part the role it uses. Commands never create one (``keylane up``
    and ``keylane worker`` do): a command run from another folder would otherwise open a
    new, empty store there and answer "no such record". :class:`StoreMissing` says where
    it looked and how to point it at the deployment."""
    from ..workers.stores import open_existing_store

    try:
        return open_existing_store(
            settings.store_dsn(), settings.store_timeout_ms, settings.sqlite_synchronous
        )
    except StoreMissing as exc:
        raise StoreMissing(f"{exc}. {where_to_look(settings)}") from None


def where_to_look(settings: Settings) -> str:
    """How a command finds the deployment's store, for an error that found none."""
    if settings.store_url is not None:
        return (
            "The store is KEYLANE_STORE_URL (--store-url): is it the one `keylane up` or "
            "`keylane worker` uses, and has one of them started on it?"
        )
    return (
        f"The store is the SQLite file of the data directory {settings.data_dir.resolve()} "
        "(--data-dir / KEYLANE_DATA_DIR; default: keylane-data in the current folder). Run "
        "the command from the folder `keylane up` runs in, or give its data directory: "
        "keylane --data-dir /path/to/keylane-data ..."
    )


def operator() -> str:
    """Who runs this command (kept on the review rows it closes)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def emit_json(value: Any) -> None:
    """Print ``value`` as indented JSON."""
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def when(ts: float | None) -> str | None:
    """A UTC timestamp for tables."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def parse_age(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``3d`` (or plain seconds) -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip().lower()
    try:
        if text and text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError:
        raise KeylaneError(f"not a duration: {text!r} (use e.g. 90s, 15m, 2h, 3d)") from None


def age(ts: float, now: float) -> str:
    """How long ago ``ts`` was, briefly (``42s``, ``5m``, ``3h``, ``2d``)."""
    seconds = max(0.0, now - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"

"""ops/cli_common.py: the options every ``keylane`` command shares, the settings built from
them, and the small formatting helpers of the CLI's output."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from keylane.ops.cli_common import (
    FLAGS,
    accept_deployment_options,
    age,
    cli_store,
    emit_json,
    setting_option,
    settings_of,
    when,
    where_to_look,
)
from keylane.routing.contract.errors import ConfigError, StoreMissing
from keylane.routing.contract.settings_env import load_settings
from keylane.workers.stores import open_store


@pytest.fixture(autouse=True)
def root_logging() -> Iterator[None]:
    """settings_of configures the root logger: put it back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def tiny_cli() -> click.Group:
    """A group like ``keylane``'s: one command with a setting option of its own."""

    @click.group()
    def cli() -> None:
        pass

    @cli.command()
    @setting_option("--lease-ttl-ms", "lease_ttl_ms", "Lease time to live.", type=int)
    @click.pass_context
    def show(ctx: click.Context) -> None:
        settings = settings_of(ctx)
        assert settings_of(ctx) is settings  # built once
        emit_json({"shards": settings.shard_count, "ttl": settings.lease_ttl_ms})

    accept_deployment_options(cli)
    return cli


def test_a_setting_options_help_shows_its_default_and_variable_from_the_settings() -> None:
    result = CliRunner().invoke(tiny_cli(), ["show", "--help"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    default = load_settings().lease_ttl_ms
    assert f"Lease time to live. [default: {default}; env KEYLANE_LEASE_TTL_MS]" in text
    assert "[default: none; env KEYLANE_REDIS_URL]" in text
    assert FLAGS["lease_ttl_ms"] == "--lease-ttl-ms"


def test_options_given_after_the_subcommand_override_the_settings(tmp_path: Path) -> None:
    args = ["show", "--data-dir", str(tmp_path), "--redis-url", "redis://127.0.0.1:1/0"]
    result = CliRunner().invoke(tiny_cli(), [*args, "--shards", "8", "--lease-ttl-ms", "9000"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"shards": 8, "ttl": 9000}


def test_an_invalid_option_is_named_by_its_flag_and_its_variable(tmp_path: Path) -> None:
    result = CliRunner().invoke(tiny_cli(), ["show", "--data-dir", str(tmp_path), "--shards", "0"])
    assert isinstance(result.exception, ConfigError)
    assert "--shards / KEYLANE_SHARD_COUNT: must be at least 1" in str(result.exception)


def test_a_command_never_creates_a_store_and_says_where_it_looked(tmp_path: Path) -> None:
    # Given a data directory that no worker has used
    settings = load_settings(data_dir=tmp_path)
    # When a command asks for the store, it is missing, and the message says where
    with pytest.raises(StoreMissing) as raised:
        cli_store(settings)
    assert "there is no keylane store at" in str(raised.value)
    assert f"the data directory {tmp_path.resolve()}" in str(raised.value)
    assert not (tmp_path / "store.sqlite3").exists()
    assert list(tmp_path.iterdir()) == []


def test_a_command_opens_the_store_a_worker_made(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'made.sqlite3'}"
    made = open_store(url)
    made.migrate()
    made.close()
    store = cli_store(load_settings(data_dir=tmp_path, store_url=url))
    try:
        assert store.read("contact:1").revision == 0
    finally:
        store.close()


def test_where_to_look_names_the_store_url_when_one_is_set(tmp_path: Path) -> None:
    named = where_to_look(load_settings(data_dir=tmp_path, store_url="sqlite:////x.db"))
    assert named.startswith("The store is KEYLANE_STORE_URL (--store-url)")
    assert str(tmp_path) not in named


def test_when_is_utc_to_the_second() -> None:
    assert when(0.0) == "1970-01-01 00:00:00"
    assert when(1_700_000_000.9) == "2023-11-14 22:13:20"
    assert when(None) is None


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0s"),
        (42, "42s"),
        (59.4, "59s"),
        (60, "1m"),
        (300, "5m"),
        (3600 * 3, "3h"),
        (86400 * 2, "2d"),
    ],
)
def test_age_is_brief_in_the_largest_unit_reached(seconds: float, shown: str) -> None:
    assert age(1000.0, 1000.0 + seconds) == shown


def test_an_age_in_the_future_is_zero() -> None:
    assert age(1000.0, 990.0) == "0s"

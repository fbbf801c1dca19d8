"""The ``keylane`` command.

Shared options read ``KEYLANE_*`` environment variables and are collected once into the
settings object (``ctx.obj``) that every subcommand uses.
"""

from __future__ import annotations

import signal
from pathlib import Path

import click

from keylane.ops.cli_common import cli_store, emit_json, settings_of
from keylane.ops.cli_dlq import dlq
from keylane.ops.cli_records import records
from keylane.ops.observability import init_sentry
from keylane.routing.contract.errors import KeylaneError
from keylane.routing.contract.logcontext import configure_logging
from keylane.routing.contract.settings import Settings, load_settings


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    envvar="KEYLANE_DATA_DIR",
    help="Data directory (SQLite store, embedded Redis). [env KEYLANE_DATA_DIR]",
)
@click.option(
    "--redis-url",
    envvar="KEYLANE_REDIS_URL",
    help="Redis URL; default: the embedded Redis of the data directory.",
)
@click.option(
    "--store-url",
    envvar="KEYLANE_STORE_URL",
    help="sqlite:///path or postgresql://...; default: SQLite in the data directory.",
)
@click.option(
    "--shards",
    "shard_count",
    type=int,
    envvar="KEYLANE_SHARD_COUNT",
    help="Shard count (fixed for the life of a deployment). Default 64.",
)
@click.option("--log-level", envvar="KEYLANE_LOG_LEVEL", default="INFO", show_default=True)
@click.pass_context
def cli(
    ctx: click.Context,
    data_dir: Path | None,
    redis_url: str | None,
    store_url: str | None,
    shard_count: int | None,
    log_level: str,
) -> None:
    """keylane: webhook lanes with one owner per record and versioned writes."""
    configure_logging(log_level)
    ctx.obj = load_settings(
        data_dir=data_dir,
        redis_url=redis_url,
        store_url=store_url,
        shard_count=shard_count,
        log_level=log_level,
    )


def main() -> None:
    """Entry point: turns keylane errors into a message and exit code 2."""
    try:
        cli(standalone_mode=True)
    except KeylaneError as exc:
        click.echo(f"keylane: {exc}", err=True)
        raise SystemExit(2) from exc


# -- the stack ---------------------------------------------------------------------------


@cli.command()
@click.option(
    "--port",
    type=int,
    envvar="KEYLANE_PORT",
    default=8000,
    show_default=True,
    help="Receiver HTTP port.",
)
@click.option("--host", envvar="KEYLANE_HOST", default="127.0.0.1", show_default=True)
@click.option(
    "--workers",
    type=int,
    default=2,
    show_default=True,
    help="Worker processes (shards are split evenly between them).",
)
@click.option(
    "--lanes",
    type=int,
    envvar="KEYLANE_LANES",
    default=4,
    show_default=True,
    help="Lanes (concurrent shards) per worker process.",
)
@click.option(
    "--flower-port", type=int, envvar="KEYLANE_FLOWER_PORT", default=5555, show_default=True
)
@click.option("--no-flower", is_flag=True, help="Do not start Flower.")
@click.option(
    "--data-dir",
    "up_data_dir",
    type=click.Path(path_type=Path),
    help="Data directory (same as `keylane --data-dir`).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Do not start anything: check the stack of this data directory and port, "
    "exit 0 if healthy, 1 if not.",
)
@click.pass_context
def up(
    ctx: click.Context,
    port: int,
    host: str,
    workers: int,
    lanes: int,
    flower_port: int,
    no_flower: bool,
    up_data_dir: Path | None,
    check: bool,
) -> None:
    """Run receiver, workers and Flower (and an embedded Redis if none is configured)."""
    if up_data_dir is not None:
        ctx.find_root().obj = settings_of(ctx).model_copy(update={"data_dir": up_data_dir})
    from keylane.ops.up import Supervisor, UpOptions

    if check:
        _exit_with_checks(settings_of(ctx), f"http://{host}:{port}")

    settings = settings_of(ctx).model_copy(
        update={"port": port, "host": host, "lanes": lanes, "flower_port": flower_port}
    )
    init_sentry(settings, "supervisor")
    code = Supervisor(settings, UpOptions(workers=workers, flower=not no_flower)).run()
    raise SystemExit(code)


@cli.command()
@click.option("--port", type=int, envvar="KEYLANE_PORT", default=8000, show_default=True)
@click.option("--host", envvar="KEYLANE_HOST", default="127.0.0.1", show_default=True)
@click.pass_context
def serve(ctx: click.Context, port: int, host: str) -> None:
    """Run the webhook receiver only."""
    import uvicorn

    from keylane.producers.receiver import create_receiver

    settings = settings_of(ctx)
    init_sentry(settings, "receiver")  # before the app exists: the integration wraps it
    app = create_receiver(settings)
    # uvicorn drains on SIGTERM/SIGINT, then raises the signal again for the previous
    # handler: a handler of ours turns that graceful stop into exit code 0.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_config=None,  # keep keylane's log format for uvicorn's lines too
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=10,
    )


@cli.command()
@click.option(
    "--lanes",
    type=int,
    envvar="KEYLANE_LANES",
    default=4,
    show_default=True,
    help="Lanes (concurrent shards) in this process.",
)
@click.pass_context
def worker(ctx: click.Context, lanes: int) -> None:
    """Run one worker process: it joins the others and takes its share of the shards."""
    from keylane.workers.worker import run_worker

    settings = settings_of(ctx).model_copy(update={"lanes": lanes})
    init_sentry(settings, "worker")
    run_worker(settings, loglevel=settings.log_level)


@cli.command()
@click.option("--port", type=int, envvar="KEYLANE_FLOWER_PORT", default=5555, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True)
@click.pass_context
def flower(ctx: click.Context, port: int, address: str) -> None:
    """Run Flower on this deployment's Celery app."""
    from keylane.workers.app import create_app

    settings = settings_of(ctx)
    app = create_app(settings)
    argv = ["flower", f"--port={port}", f"--address={address}"]
    if settings.flower_basic_auth is not None:
        argv.append(f"--basic-auth={settings.flower_basic_auth.get_secret_value()}")
    app.start(argv=argv)


# -- status --------------------------------------------------------------------------------


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Shards (owner, fencing token, depth, oldest message, in flight) and workers."""
    from keylane.ops.status import collect_status
    from keylane.ops.tables import render_table
    from keylane.ops.telemetry import DeploymentView

    settings = settings_of(ctx)
    view = DeploymentView.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    report = collect_status(settings, view)
    if as_json:
        emit_json(report)
        return
    click.echo(
        render_table(
            ["shard", "owner", "token", "depth", "oldest_s", "in_flight"],
            [
                [s["shard"], s["owner"], s["token"], s["depth"], s["oldest_age_s"], s["in_flight"]]
                for s in report["shards"]
            ],
        )
    )
    click.echo("")
    click.echo(
        render_table(
            ["worker", "shards", "heartbeat_age_s"],
            [[w["worker"], w["shards"], w["heartbeat_age_s"]] for w in report["workers"]],
        )
    )
    if report["unowned"]:
        click.echo(f"\nunowned shards: {report['unowned']}")


@cli.command("check")
@click.option("--receiver", "receiver_url", help="Also check this receiver's /readyz.")
@click.option("--max-age", help="Fail if a shard's oldest message is older (e.g. 5m).")
@click.pass_context
def check_command(ctx: click.Context, receiver_url: str | None, max_age: str | None) -> None:
    """Health for orchestrators: Redis, store, every shard owned (and the receiver).

    Exit code 0 when everything is healthy, 1 otherwise.
    """
    from keylane.ops.triage import parse_age

    _exit_with_checks(settings_of(ctx), receiver_url, parse_age(max_age) if max_age else None)


def _exit_with_checks(
    settings: Settings, receiver_url: str | None, max_age_s: float | None = None
) -> None:
    from keylane.ops.health import run_checks

    results = run_checks(settings, receiver_url, max_age_s)
    for result in results:
        click.echo(f"{'ok  ' if result.ok else 'FAIL'} {result.name:<9} {result.detail}")
    raise SystemExit(0 if all(r.ok for r in results) else 1)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def audit(ctx: click.Context, as_json: bool) -> None:
    """Check the lease log and the journal for any sign of two owners of one shard.

    Exit code 0 when both are clean, 1 when a problem is found.
    """
    from keylane.ops.audit import audit_journal, audit_lease_log
    from keylane.ops.telemetry import DeploymentView

    settings = settings_of(ctx)
    view = DeploymentView.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    events = view.lease_events()
    store = cli_store(settings)
    try:
        entries = store.journal_entries()
    finally:
        store.close()
    lease_problems, journal_problems = audit_lease_log(events), audit_journal(entries)
    problems = lease_problems + journal_problems
    report = {
        "lease_events": len(events),
        "journal_entries": len(entries),
        "lease_log_problems": lease_problems,
        "journal_problems": journal_problems,
    }
    if as_json:
        emit_json(report)
    else:
        click.echo(f"lease log: {len(events)} events; journal: {len(entries)} entries")
        for line in problems:
            click.echo(f"PROBLEM {line}")
        click.echo(
            "no shard ever had two owners" if not problems else f"{len(problems)} problem(s)"
        )
    raise SystemExit(1 if problems else 0)


cli.add_command(records)
cli.add_command(dlq)


if __name__ == "__main__":
    main()

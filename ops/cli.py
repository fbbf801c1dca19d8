"""The ``keylane`` command.

Shared options read ``KEYLANE_*`` environment variables and are collected once into the
settings object (``ctx.obj``) that every subcommand uses.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click

from workers.errors import KeylaneError
from workers.settings import Settings, load_settings
from workers.stores import open_store
from workers.stores.base import DEAD_LETTER_STATUSES, DeadLetter, DeadLetterFilter, Store

F = TypeVar("F", bound=Callable[..., Any])


def _settings(ctx: click.Context) -> Settings:
    settings = ctx.obj
    assert isinstance(settings, Settings)
    return settings


def _store(settings: Settings) -> Store:
    store = open_store(settings.store_dsn(), settings.store_timeout_ms, settings.sqlite_synchronous)
    store.migrate()  # idempotent: a fresh data directory reads as empty, not as an error
    return store


def _emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def _when(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


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
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
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
@click.pass_context
def up(
    ctx: click.Context,
    port: int,
    host: str,
    workers: int,
    lanes: int,
    flower_port: int,
    no_flower: bool,
) -> None:
    """Run receiver, workers and Flower (and an embedded Redis if none is configured)."""
    from ops.up import Supervisor, UpOptions

    settings = _settings(ctx).model_copy(
        update={"port": port, "host": host, "lanes": lanes, "flower_port": flower_port}
    )
    code = Supervisor(settings, UpOptions(workers=workers, flower=not no_flower)).run()
    raise SystemExit(code)


@cli.command()
@click.option("--port", type=int, envvar="KEYLANE_PORT", default=8000, show_default=True)
@click.option("--host", envvar="KEYLANE_HOST", default="127.0.0.1", show_default=True)
@click.pass_context
def serve(ctx: click.Context, port: int, host: str) -> None:
    """Run the webhook receiver only."""
    import uvicorn

    from producers.receiver import create_receiver

    settings = _settings(ctx)
    app = create_receiver(settings)
    uvicorn.run(
        app,
        host=host,
        port=port,
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
    from workers.worker import run_worker

    settings = _settings(ctx).model_copy(update={"lanes": lanes})
    run_worker(settings, loglevel=settings.log_level)


@cli.command()
@click.option("--port", type=int, envvar="KEYLANE_FLOWER_PORT", default=5555, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True)
@click.pass_context
def flower(ctx: click.Context, port: int, address: str) -> None:
    """Run Flower on this deployment's Celery app."""
    from workers.app import create_app

    settings = _settings(ctx)
    app = create_app(settings)
    argv = ["flower", f"--port={port}", f"--address={address}"]
    if settings.flower_basic_auth is not None:
        argv.append(f"--basic-auth={settings.flower_basic_auth.get_secret_value()}")
    app.start(argv=argv)


# -- records ------------------------------------------------------------------------------


@cli.group()
def records() -> None:
    """Read records, or edit them from outside the lanes."""


@records.command("get")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def records_get(ctx: click.Context, key: str, as_json: bool) -> None:
    """Print the record KEY with its revision."""
    from ops.records import record_json

    store = _store(_settings(ctx))
    try:
        record = store.read(key)
    finally:
        store.close()
    if as_json:
        _emit_json(record_json(record))
        return
    if not record.exists:
        click.echo(f"{key}: no such record")
        raise SystemExit(1)
    click.echo(f"{key}  revision {record.revision}  updated {_when(record.updated_at)}")
    for name in sorted(record.fields):
        click.echo(f"  {name} = {json.dumps(record.fields[name])}")


@records.command("set")
@click.argument("key")
@click.argument("assignments", nargs=-1)
@click.option("--unset", "unset", multiple=True, help="Remove this field (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the record written, as JSON.")
@click.pass_context
def records_set(
    ctx: click.Context,
    key: str,
    assignments: tuple[str, ...],
    unset: tuple[str, ...],
    as_json: bool,
) -> None:
    """Edit KEY as a person would: FIELD=VALUE... (VALUE is JSON if it parses, else text).

    The write is revision-checked and advances the revision.
    """
    from ops.records import edit_record, parse_assignment, record_json

    if not assignments and not unset:
        raise click.UsageError("give at least one FIELD=VALUE or --unset FIELD")
    assign = dict(parse_assignment(a) for a in assignments)
    store = _store(_settings(ctx))
    try:
        record = edit_record(store, key, assign, list(unset))
    finally:
        store.close()
    if as_json:
        _emit_json(record_json(record))
    else:
        click.echo(f"{key}: revision {record.revision}")


# -- dead letters ---------------------------------------------------------------------------


def _dl_json(row: DeadLetter) -> dict[str, Any]:
    return {
        "id": row.id,
        "created_at": row.created_at,
        "status": row.status,
        "reason": row.reason,
        "source": row.source,
        "event_id": row.event_id,
        "record_key": row.record_key,
        "shard": row.shard,
        "attempts": row.attempts,
        "revision_read": row.revision_read,
        "revision_found": row.revision_found,
        "error": row.error,
        "attempted_change": row.attempted_change,
        "event": row.event,
        "status_by": row.status_by,
        "status_at": row.status_at,
        "note": row.note,
        "retry_of": row.retry_of,
    }


@cli.group()
def dlq() -> None:
    """The dead-letter review queue."""


@dlq.command("list")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(DEAD_LETTER_STATUSES),
    help="Only rows in this status (repeatable). Default: open.",
)
@click.option("--all", "all_statuses", is_flag=True, help="Rows in any status.")
@click.option("--reason", "reasons", multiple=True, help="Only this reason (repeatable).")
@click.option("--source", "sources", multiple=True, help="Only this source (repeatable).")
@click.option("--key", "record_key", help="Only this record key.")
@click.option("--limit", type=int, default=None, help="At most this many rows.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def dlq_list(
    ctx: click.Context,
    statuses: tuple[str, ...],
    all_statuses: bool,
    reasons: tuple[str, ...],
    sources: tuple[str, ...],
    record_key: str | None,
    limit: int | None,
    as_json: bool,
) -> None:
    """List review rows, oldest first."""
    from ops.tables import render_table

    if not statuses and not all_statuses:
        statuses = ("open",)
    flt = DeadLetterFilter(
        statuses=statuses, reasons=reasons, sources=sources, record_key=record_key, limit=limit
    )
    store = _store(_settings(ctx))
    try:
        rows = store.dead_letters(flt)
    finally:
        store.close()
    if as_json:
        _emit_json([_dl_json(r) for r in rows])
        return
    click.echo(
        render_table(
            [
                "id",
                "created",
                "status",
                "reason",
                "source",
                "event",
                "record",
                "read",
                "found",
                "tries",
            ],
            [
                [
                    r.id,
                    _when(r.created_at),
                    r.status,
                    r.reason,
                    r.source,
                    r.event_id,
                    r.record_key,
                    r.revision_read,
                    r.revision_found,
                    r.attempts,
                ]
                for r in rows
            ],
        )
    )
    click.echo(f"{len(rows)} row(s)")


@dlq.command("show")
@click.argument("row_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def dlq_show(ctx: click.Context, row_id: int, as_json: bool) -> None:
    """Show one review row with the record as it is now."""
    store = _store(_settings(ctx))
    try:
        row = store.dead_letter(row_id)
        record = store.read(row.record_key) if row else None
    finally:
        store.close()
    if row is None:
        raise KeylaneError(f"no dead letter with id {row_id}")
    assert record is not None
    if as_json:
        _emit_json(
            {**_dl_json(row), "record_now": {"revision": record.revision, "fields": record.fields}}
        )
        return
    click.echo(f"dead letter {row.id}  [{row.status}]  reason: {row.reason}")
    click.echo(f"  event     {row.source}/{row.event_id}  ({row.event.get('event_type', '?')})")
    click.echo(f"  record    {row.record_key}  shard {row.shard}")
    click.echo(
        f"  revisions read {row.revision_read}, found {row.revision_found}, now {record.revision}"
    )
    click.echo(f"  attempts  {row.attempts}   created {_when(row.created_at)}")
    click.echo(f"  error     {row.error}")
    click.echo("  attempted change:")
    for name, change in sorted(row.attempted_change.items()):
        now = json.dumps(record.fields.get(name)) if name in record.fields else "(absent)"
        click.echo(f"    {name}: {json.dumps(change)}   now: {now}")


# -- status --------------------------------------------------------------------------------


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Shards (owner, fencing token, depth, oldest message, in flight) and workers."""
    from ops.status import collect_status
    from ops.tables import render_table
    from workers.lanebroker import LaneBroker

    settings = _settings(ctx)
    broker = LaneBroker.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    report = collect_status(settings, broker)
    if as_json:
        _emit_json(report)
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


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def audit(ctx: click.Context, as_json: bool) -> None:
    """Check the lease log and the journal for any sign of two owners of one shard.

    Exit code 0 when both are clean, 1 when a problem is found.
    """
    from ops.audit import audit_journal, audit_lease_log
    from workers.lanebroker import LaneBroker

    settings = _settings(ctx)
    broker = LaneBroker.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    events = broker.lease_events()
    store = _store(settings)
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
        _emit_json(report)
    else:
        click.echo(f"lease log: {len(events)} events; journal: {len(entries)} entries")
        for line in problems:
            click.echo(f"PROBLEM {line}")
        click.echo(
            "no shard ever had two owners" if not problems else f"{len(problems)} problem(s)"
        )
    raise SystemExit(1 if problems else 0)


if __name__ == "__main__":
    main()

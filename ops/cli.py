"""The ``keylane`` command.

Shared options read ``KEYLANE_*`` environment variables and are collected once into the
settings object (``ctx.obj``) that every subcommand uses.
"""

from __future__ import annotations

import logging
import os

import click

from ..routing.contract.errors import KeylaneError
from ..routing.contract.settings import Settings
from .cli_common import (
    accept_deployment_options,
    cli_store,
    deployment_params,
    emit_json,
    parse_age,
    setting_option,
    settings_of,
)
from .cli_lazy import LazyCommand, LazyGroup

#: The subcommands defined in modules of their own, imported when one is used: each
#: with its short help for ``keylane --help`` (the first sentence of its own help).
LAZY_COMMANDS = {
    "deliveries": LazyCommand(
        "keylane.ops.cli_deliveries:deliveries",
        "Deliveries kept (turned away, ignored, accepted): list, show, rerun (alone: the "
        "list, as ``deliveries list``).",
    ),
    "dlq": LazyCommand(
        "keylane.ops.cli_dlq:dlq",
        "The dead-letter review queue: list, show, retry, discard, resolve, export, stats "
        "(alone: the open rows, as ``dlq list``).",
    ),
    "journal": LazyCommand(
        "keylane.ops.cli_journal:journal",
        "The journal of applied events: find an event, prune what is past its retention.",
    ),
    "merges": LazyCommand(
        "keylane.ops.cli_merges:merges",
        "Merges waiting for a person: list, show, resolve (a side per field), apart; undo a "
        "merge applied; reconcile records that share a stable key (alone: the open reviews, "
        "as ``merges list``).",
    ),
    "outcome": LazyCommand(
        "keylane.ops.cli_outcomes:outcome",
        "The outcome of SOURCE's event EVENT_ID: applied (at which revision, with its "
        "result), refused (the condition, the value seen) or dead-lettered (its review row), "
        "as the lane told it in Redis; when Redis has none, what the journal says.",
    ),
    "records": LazyCommand(
        "keylane.ops.cli_records:records",
        "List records, read one, or edit one from outside the lanes (alone: the first page "
        "of the list, as ``records list``).",
    ),
    "repair": LazyCommand(
        "keylane.ops.cli_schedules:repair",
        "Sweep keylane's store with the repair NAME now: a repair event into the lane of "
        "each record its check would change (the lane checks again on a fresh read).",
    ),
    "run": LazyCommand(
        "keylane.ops.cli_schedules:run_command",
        "Run the scheduled job JOB once, now, under its lease (exit code 1 if a run of it "
        "is going, or it failed).",
    ),
    "scheduler": LazyCommand(
        "keylane.ops.cli_schedules:scheduler",
        "Run a scheduler: scheduled jobs and repair sweeps at their ticks.",
    ),
    "schedules": LazyCommand(
        "keylane.ops.cli_schedules:schedules",
        "Scheduled jobs: when they run, the run going, the last and next runs, and what "
        "became of their ticks (started, buffered, skipped, missed) and runs.",
    ),
    "send": LazyCommand(
        "keylane.ops.cli_send:send",
        "Send the body in --file to the receiver as SOURCE's sender would: signed with the "
        "source's own secret (its secrets_env, the first one; or the secret its sender "
        "handed over in a handshake), the event id in the header its scheme carries it in, "
        "to the URL the signature names where the scheme signs one (KEYLANE_PUBLIC_URL).",
    ),
    "sources": LazyCommand(
        "keylane.ops.cli_sources:sources",
        "The sources of this deployment (alone: the list, as ``sources list``).",
    ),
}


@click.group(
    cls=LazyGroup,
    lazy=LAZY_COMMANDS,
    on_load=accept_deployment_options,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="keylane", prog_name="keylane", message="%(prog)s %(version)s")
def cli() -> None:
    """keylane: webhook lanes with one owner per record and versioned writes.

    The deployment options (--data-dir, --redis-url, --store-url, --shards, --log-level,
    --log-format) go before or after the command; each also reads its KEYLANE_*
    environment variable.
    """


cli.params.extend(deployment_params())


APP_HELP = "Modules with your tasks, imported first (comma-separated), as celery -A."
OPS_PORT_HELP = "The operations listener's port (/metrics): never the webhook port."
OPS_HOST_HELP = "The operations listener's address (loopback unless set)."


def main() -> None:
    """Entry point: turns keylane errors into a message and exit code 2."""
    try:
        cli(standalone_mode=True)
    except KeylaneError as exc:
        click.echo(f"keylane: {exc}", err=True)
        raise SystemExit(2) from exc


# -- the stack ---------------------------------------------------------------------------


@cli.command()
@setting_option("--port", "port", "Receiver HTTP port.", type=int)
@setting_option("--host", "host", "Receiver address.")
@setting_option(
    "--workers",
    "worker_processes",
    "Worker processes, shards split evenly between them (none: 1 on SQLite, which takes "
    "one writer process; 2 on PostgreSQL).",
    type=int,
)
@setting_option("--lanes", "lanes", "Records in flight per worker process.", type=int)
@setting_option(
    "--lane-threads", "lane_threads", "Threads per worker process for blocking calls.", type=int
)
@setting_option("--ops-port", "ops_port", OPS_PORT_HELP, type=int)
@setting_option("--flower-port", "flower_port", "Flower's HTTP port.", type=int)
@setting_option("-A --app", "app", APP_HELP)
@click.option("--no-flower", is_flag=True, help="Do not start Flower.")
@click.option(
    "--check",
    is_flag=True,
    help="Do not start anything: check the stack of this data directory and port, "
    "exit 0 if healthy, 1 if not.",
)
@click.option(
    "--wait",
    "wait_for",
    metavar="DURATION",
    help="With --check: check again until the stack answers or DURATION has passed "
    "(60s, 2m), then exit as --check does: `keylane up & keylane up --check --wait 2m` "
    "returns once the receiver takes deliveries.",
)
@click.pass_context
def up(ctx: click.Context, no_flower: bool, check: bool, wait_for: str | None) -> None:
    """Run receiver, workers, a scheduler and Flower (and an embedded Redis if none is
    configured)."""
    from .observability import init_sentry
    from .up import Supervisor, UpOptions

    settings = settings_of(ctx)
    if wait_for is not None and not check:
        raise click.UsageError("--wait goes with --check (keylane up --check --wait 2m)")
    if check:
        wait_s = parse_age(wait_for) if wait_for else 0.0
        _exit_with_checks(settings, f"http://{settings.host}:{settings.port}", wait_s=wait_s)
    init_sentry(settings, "supervisor")
    code = Supervisor(settings, UpOptions(flower=not no_flower)).run()
    raise SystemExit(code)


@cli.command()
@setting_option("--port", "port", "Receiver HTTP port.", type=int)
@setting_option("--host", "host", "Receiver address.")
@setting_option("--ops-port", "ops_port", OPS_PORT_HELP, type=int)
@setting_option("--ops-host", "ops_host", OPS_HOST_HELP)
@click.pass_context
def serve(ctx: click.Context) -> None:
    """Run the webhook receiver only, with its operations listener (port 0: one the
    system picks, named in the log)."""
    from .serving import serve_receiver

    settings = settings_of(ctx)
    if settings.log_level != "DEBUG":
        logging.getLogger("uvicorn.error").addFilter(_UvicornStartSteps())
    serve_receiver(settings)


class _UvicornStartSteps(logging.Filter):
    """uvicorn's start-up steps: three lines before the one that says where it listens."""

    STEPS = ("Started server process", "Waiting for application startup", "Application startup")

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.STEPS)


@cli.command()
@setting_option("--lanes", "lanes", "Records in flight in this process.", type=int)
@setting_option(
    "--lane-threads", "lane_threads", "Threads for blocking calls in this process.", type=int
)
@setting_option("-A --app", "app", APP_HELP)
@click.pass_context
def worker(ctx: click.Context) -> None:
    """Run one worker process: it joins the others and takes its share of the shards."""
    from ..workers.service import check_worker_config
    from ..workers.worker import run_worker
    from .observability import init_sentry

    settings = settings_of(ctx)
    check_worker_config(settings)  # a task or destination that cannot work stops it here
    init_sentry(settings, "worker")
    run_worker(settings, loglevel=settings.log_level)


@cli.command()
@setting_option("--port", "flower_port", "Flower's HTTP port.", type=int)
@setting_option("--address", "flower_address", "Flower's address.")
@click.pass_context
def flower(ctx: click.Context) -> None:
    """Run Flower on this deployment's Celery app. On an address other than loopback it
    refuses to start without a password (KEYLANE_FLOWER_BASIC_AUTH=user:password)."""
    from ..workers.app import create_app
    from .up_checks import check_flower_exposure

    settings = settings_of(ctx)
    auth = settings.flower_basic_auth is not None
    check_flower_exposure(settings.flower_address, auth, os.environ)
    app = create_app(settings)
    # Flower's own start-up lines are quiet at INFO (see configure_logging): say where it is.
    where = f"http://{settings.flower_address}:{settings.flower_port}"
    logging.getLogger("keylane.flower").info("Flower on %s", where)
    argv = ["flower", f"--port={settings.flower_port}", f"--address={settings.flower_address}"]
    if "FLOWER_TASKS_COLUMNS" not in os.environ:
        # Rows told apart by record: the args column holds (record key, source, event id).
        argv.append(f"--tasks_columns={TASKS_COLUMNS}")
    if settings.flower_basic_auth is not None:
        argv.append(f"--basic-auth={settings.flower_basic_auth.get_secret_value()}")
    if settings.log_level != "DEBUG":
        logging.getLogger("flower.inspector").addFilter(_NoWorkerAnsweredYet())
    app.start(argv=argv)


#: The columns of Flower's task list (Flower's own default shows name and UUID first).
TASKS_COLUMNS = "name,args,state,received,runtime,worker,uuid"


class _NoWorkerAnsweredYet(logging.Filter):
    """Flower asks the workers as it starts; until one answers it warns "Inspect method X
    failed" once per method: four lines at every ``keylane up``, nothing to act on. Those
    are dropped; a failure with a reason (the broker lost) still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Inspect method ") and message.endswith(" failed"))


# -- status --------------------------------------------------------------------------------


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--stuck-after",
    default="60s",
    show_default=True,
    help="A shard whose oldest event is older than this is shown as stuck (90s, 15m, 2h).",
)
@click.pass_context
def status(ctx: click.Context, as_json: bool, stuck_after: str) -> None:
    """Stuck and busy shards first (owner, fencing token, depth, oldest event, records in
    flight and waiting), the idle ones in one line; the records that wait (why, attempts,
    when due, events behind them); workers; destinations and every outcome of their calls;
    scheduled jobs; counters."""
    from .status import collect_merges, collect_retention, collect_status
    from .status_text import render_status
    from .views import open_view

    settings = settings_of(ctx)
    view = open_view(settings)
    try:
        report = collect_status(settings, view, parse_age(stuck_after))
    finally:
        view.close()
    report["retention"] = collect_retention(settings)
    report["merges"] = collect_merges(settings, report["counters"])
    if as_json:
        emit_json(report)
        return
    click.echo(render_status(report))


@cli.command("check")
@click.option("--receiver", "receiver_url", help="Also check this receiver's /readyz.")
@click.option("--max-age", help="Fail if a shard's oldest message is older (e.g. 5m).")
@click.pass_context
def check_command(ctx: click.Context, receiver_url: str | None, max_age: str | None) -> None:
    """Health for orchestrators: Redis, store, every shard owned (and the receiver).

    Exit code 0 when everything is healthy, 1 otherwise.
    """

    _exit_with_checks(settings_of(ctx), receiver_url, parse_age(max_age) if max_age else None)


def _exit_with_checks(
    settings: Settings,
    receiver_url: str | None,
    max_age_s: float | None = None,
    wait_s: float = 0.0,
) -> None:
    from .health import run_checks_until_healthy

    results = run_checks_until_healthy(settings, receiver_url, max_age_s, wait_s)
    for result in results:
        click.echo(f"{'ok  ' if result.ok else 'FAIL'} {result.name:<9} {result.detail}")
    raise SystemExit(0 if all(r.ok for r in results) else 1)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def audit(ctx: click.Context, as_json: bool) -> None:
    """Check the lease log and the journal for any sign of two owners of one shard, and
    (on Redis) each shard's depth count against the records' lists it counts.

    Exit code 0 when both are clean, 1 when a problem is found.
    """
    from .audit import audit_depth, audit_journal, audit_lease_log
    from .views import open_view

    settings = settings_of(ctx)
    view = open_view(settings)
    try:
        events, counts = view.lease_events(), view.admitted_counts()
        keeps_lease_log = view.keeps_lease_log
    finally:
        view.close()
    store = cli_store(settings)
    try:
        entries = store.journal_entries()
    finally:
        store.close()
    lease_problems, journal_problems = audit_lease_log(events), audit_journal(entries)
    depth_problems = audit_depth(counts)
    problems = lease_problems + journal_problems + depth_problems
    report = {
        "lease_events": len(events),
        "journal_entries": len(entries),
        "lease_log_problems": lease_problems,
        "journal_problems": journal_problems,
        "depth_problems": depth_problems,
    }
    if as_json:
        emit_json(report)
    else:
        leases = (
            "no lease log on RabbitMQ (its single active consumer owns each shard)"
            if not keeps_lease_log
            else f"lease log: {len(events)} events"
        )
        click.echo(f"{leases}; journal: {len(entries)} entries")
        for line in problems:
            click.echo(f"PROBLEM {line}")
        click.echo(
            "no shard ever had two owners" if not problems else f"{len(problems)} problem(s)"
        )
    raise SystemExit(1 if problems else 0)


accept_deployment_options(cli)


if __name__ == "__main__":
    main()

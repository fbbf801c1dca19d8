"""``keylane scheduler``, ``keylane schedules``, ``keylane run`` and ``keylane repair``:
scheduled jobs and repairs, run and listed."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from .cli_common import emit_json, setting_option, settings_of
from .observability import init_sentry
from .status_text import schedule_table

APP_HELP = "Modules with your jobs and repairs, imported first (comma-separated)."


@click.command()
@setting_option("-A --app", "app", APP_HELP)
@click.pass_context
def scheduler(ctx: click.Context) -> None:
    """Run a scheduler: scheduled jobs and repair sweeps at their ticks. Run two (or
    more), anywhere that reaches Redis and the store: each run has one runner, and the
    others take over when it dies."""
    from .scheduled import deployment_jobs, run_scheduler

    settings = settings_of(ctx)
    deployment_jobs(settings)  # a job that cannot load stops it here, exit code 2
    init_sentry(settings, "scheduler")
    run_scheduler(settings)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def schedules(ctx: click.Context, as_json: bool) -> None:
    """Scheduled jobs: when they run, the run going, the last and next runs, and what
    became of their ticks (started, buffered, skipped, missed) and runs."""
    from .deployment_view import DeploymentView
    from .tables import render_table

    settings = settings_of(ctx)
    view = DeploymentView.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    states = [state.as_dict() for state in view.schedules()]
    if as_json:
        emit_json(states)
        return
    click.echo(render_table(*schedule_table(states)))


@click.command("run")
@click.argument("job")
@setting_option("-A --app", "app", APP_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def run_command(ctx: click.Context, job: str, as_json: bool) -> None:
    """Run the scheduled job JOB once, now, under its lease (exit code 1 if a run of it
    is going, or it failed)."""
    from .scheduled import run_job_now

    _report(run_job_now(settings_of(ctx), job), as_json)


@click.command()
@click.argument("name")
@setting_option("-A --app", "app", APP_HELP)
@click.option("--dry-run", is_flag=True, help="List what it would repair; send nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def repair(ctx: click.Context, name: str, dry_run: bool, as_json: bool) -> None:
    """Sweep keylane's store with the repair NAME now: a repair event into the lane of
    each record its check would change (the lane checks again on a fresh read)."""
    from .scheduled import repair_candidates, run_job_now

    settings = settings_of(ctx)
    if dry_run:
        found = repair_candidates(settings, name)
        if as_json:
            emit_json(found)
            return
        for item in found:
            click.echo(f"{item['record_key']}  (revision {item['revision']})  {item['change']}")
        click.echo(f"{len(found)} record(s) to repair")
        return
    _report(run_job_now(settings, name, kind="repair"), as_json)


def _report(report: Any, as_json: bool) -> None:
    from ..routing.contract.schedules import tick_text

    if as_json:
        emit_json(dataclasses.asdict(report))
    elif report.outcome == "busy":
        click.echo(f"{report.job}: {report.error}")
    else:
        click.echo(
            f"{report.job} at {tick_text(report.tick_ms)}: {report.outcome}, "
            f"{report.sent} event(s) sent ({report.duplicates} duplicates)"
            + (f"; {report.error}" if report.error else "")
        )
    raise SystemExit(0 if report.outcome == "ok" else 1)

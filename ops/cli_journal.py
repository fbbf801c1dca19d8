"""``keylane journal``: find what happened to an event (table, then archive), and prune
what is past its retention."""

from __future__ import annotations

import json

import click

from ..routing.contract.errors import StoreMissing
from ..routing.contract.sources import load_sources
from .archive import Archive
from .cli_common import cli_store, emit_json, settings_of, when, where_to_look
from .lookup import find_events
from .prune_report import PruneReport
from .retention import run_prune
from .tables import LABELS, render_table, span


@click.group()
def journal() -> None:
    """The journal of applied events: find an event, prune what is past its retention."""


@journal.command("find")
@click.argument("event_id", required=False)
@click.option("--source", help="Only this source's event.")
@click.option("--key", "record_key", help="Every event of this record (with EVENT_ID: that one).")
@click.option(
    "--all",
    "whole_archive",
    is_flag=True,
    help="Read every day of the archive, even when the table has the event.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def journal_find(
    ctx: click.Context,
    event_id: str | None,
    source: str | None,
    record_key: str | None,
    whole_archive: bool,
    as_json: bool,
) -> None:
    """What happened to EVENT_ID (or to the events of --key, with those forwarded from it
    to the record it was merged into: VIA names the key they were sent to), each with the
    delivery it came from (``keylane deliveries show``): the journal's table first, then
    the archive. Exit code 1 when nothing is found."""
    if event_id is None and record_key is None:
        raise click.UsageError("give an EVENT_ID, or --key KEY")
    settings = settings_of(ctx)
    archive = Archive(settings.archive_path)
    store = cli_store(settings)
    try:
        names = load_sources(settings).names()
        lookup = find_events(store, archive, event_id, source, record_key, names, whole_archive)
    finally:
        store.close()
    rows = [{"where": f.where, **f.row} for f in lookup.found]
    if as_json:
        emit_json(rows)
    else:
        columns = [
            *("where", "source", "event_id", "record_key", "via", "outcome", "revision"),
            "delivery",
        ]
        cells = [
            [r.get(c) for c in columns] + [when(r.get("recorded_at")), _result(r.get("result"))]
            for r in rows
        ]
        click.echo(render_table([*columns, "recorded", "result"], cells))
        click.echo(f"{len(rows)} row(s); {lookup.files_read} archive file(s) read", err=True)
    raise SystemExit(0 if rows else 1)


@journal.command("prune")
@click.option("--dry-run", is_flag=True, help="Count what is due; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def journal_prune(ctx: click.Context, dry_run: bool, as_json: bool) -> None:
    """Archive and remove journal rows, closed dead letters and lease-log entries past
    their retention (see the docs page "Retention and the archive", ops/docs/retention.md).
    Safe to run at any time, from anywhere: a second prune of the same store at once does
    nothing (exit code 3)."""
    settings = settings_of(ctx)
    try:
        report = run_prune(settings, dry_run=dry_run, progress=_progress, existing_store=True)
    except StoreMissing as exc:
        raise StoreMissing(f"{exc}. {where_to_look(settings)}") from None
    if as_json:
        emit_json(report.as_json())
    else:
        _print_report(report)
    raise SystemExit(3 if report.skipped else 0)


def _result(result: object, most: int = 80) -> str:
    """An event's result on one line (its whole JSON with --json)."""
    if result is None:
        return ""
    text = json.dumps(result, separators=(",", ":"), default=str)
    return text if len(text) <= most else text[: most - 3] + "..."


def _progress(table: str, done: int, due: int) -> None:
    click.echo(f"{table}: {done:,} of {due:,} archived", err=True)


def _print_report(report: PruneReport) -> None:
    if report.skipped:
        click.echo(f"prune skipped: {report.skipped}")
        return
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    verb = "would archive" if report.dry_run else "archived"
    rows = []
    for table, t in report.tables.items():
        archived = "-" if report.dry_run else t.archived
        rows.append([table, _retention(t.retention_s), t.due, archived, t.kept, t.files])
    click.echo(render_table(["table", "retention", "due", verb, "kept", "files"], rows))
    if not report.dry_run:
        click.echo(
            f"forgot {report.forgotten_ids:,} archived id(s); {report.batches} delete "
            f"transaction(s), longest {report.longest_batch_s * 1000:.0f} ms; settled "
            f"{report.recovered_files} file(s) left by an interrupted run; "
            f"{report.finished_at - report.started_at:.1f} s"
        )
    for table, age in report.sizes.items():
        oldest = f", oldest {when(age.oldest)} UTC" if age.oldest is not None else ""
        click.echo(f"{LABELS.get(table, table)}: {age.rows:,} row(s){oldest}")


def _retention(by_source: dict[str, int]) -> str:
    spans = [f"{s}={span(v)}" if s else span(v) for s, v in sorted(by_source.items())]
    return " ".join(spans) or "-"

"""``keylane dlq``: the dead-letter review queue, for the person on call.

Bulk operations (``retry``, ``discard``, ``resolve`` with a filter) say what they are about
to do and ask first (``--yes`` skips the question), show progress, and report what they
did, row by row with ``--json``.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

from ..workers.store_rows import DEAD_LETTER_STATUSES, DeadLetter, DeadLetterFilter
from .cli_common import age, cli_store, emit_json, operator, parse_age, settings_of
from .dead_letter_work import (
    Act,
    act_on,
    dead_letter_stats,
    discard,
    list_dead_letters,
    resolve,
    retry,
    rows_to_act_on,
    show_dead_letter,
)
from .dlq_show import show_json, show_text
from .tables import render_table
from .triage import Handled

F = TypeVar("F", bound=Callable[..., Any])


def dead_letter_json(row: DeadLetter) -> dict[str, Any]:
    """A review row as ``--json`` prints it."""
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


def filter_options(fn: F) -> F:
    """The options that select review rows."""
    options = [
        click.option(
            "--status",
            "statuses",
            multiple=True,
            type=click.Choice(DEAD_LETTER_STATUSES),
            help="Only rows in this status (repeatable).",
        ),
        click.option("--reason", "reasons", multiple=True, help="Only this reason (repeatable)."),
        click.option("--source", "sources", multiple=True, help="Only this source (repeatable)."),
        click.option("--key", "record_key", help="Only rows about this record key."),
        click.option("--older-than", help="Only rows older than this (90s, 15m, 2h, 3d)."),
        click.option("--newer-than", help="Only rows newer than this (90s, 15m, 2h, 3d)."),
        click.option("--limit", type=int, help="At most this many rows."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _filter(
    ids: Iterable[int],
    statuses: tuple[str, ...],
    reasons: tuple[str, ...],
    sources: tuple[str, ...],
    record_key: str | None,
    older_than: str | None,
    newer_than: str | None,
    limit: int | None,
) -> DeadLetterFilter:
    return DeadLetterFilter(
        statuses=statuses,
        reasons=reasons,
        sources=sources,
        record_key=record_key,
        older_than_s=parse_age(older_than) if older_than else None,
        newer_than_s=parse_age(newer_than) if newer_than else None,
        ids=tuple(ids),
        limit=limit,
    )


@click.group(invoke_without_command=True)
@click.pass_context
def dlq(ctx: click.Context) -> None:
    """The dead-letter review queue: list, show, retry, discard, resolve, export, stats
    (alone: the open rows, as ``dlq list``)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(dlq_list)


@dlq.command("list")
@filter_options
@click.option("--all", "all_statuses", is_flag=True, help="Rows in any status (default: open).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def dlq_list(ctx: click.Context, /, all_statuses: bool, as_json: bool, **selection: Any) -> None:
    """List review rows, oldest first (open ones unless --status or --all)."""
    if not selection["statuses"] and not all_statuses:
        selection["statuses"] = ("open",)
    rows = list_dead_letters(settings_of(ctx), _filter((), **selection))
    if as_json:
        emit_json([dead_letter_json(r) for r in rows])
        return
    now = time.time()
    click.echo(
        render_table(
            [
                "id",
                "age",
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
                    age(r.created_at, now),
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
def dlq_show(ctx: click.Context, /, row_id: int, as_json: bool) -> None:
    """One row: why, when, and what matters for its kind: for a change, the attempted
    change beside the record as it is now, where it lives (``*`` marks the fields where
    applying the change now would change the record); for a task or a forward, the
    payload and the answer that came back."""
    shown = show_dead_letter(settings_of(ctx), row_id)
    row, record, diffs = shown.row, shown.record, shown.diffs
    if as_json:
        emit_json(show_json(dead_letter_json(row), row, record, diffs))
        return
    click.echo("\n".join(show_text(row, record, diffs)))


def _bulk(
    ctx: click.Context,
    verb: str,
    ids: tuple[int, ...],
    yes: bool,
    as_json: bool,
    selection: dict[str, Any],
    act: Act,
) -> None:
    explicit = bool(ids)
    chosen = any(
        selection[k]
        for k in ("reasons", "sources", "record_key", "older_than", "newer_than", "statuses")
    )
    if not explicit and not chosen and not selection.pop("all_open", False):
        raise click.UsageError(
            f"give row IDs, a filter (--reason, --source, --key, "
            f"--older-than, ...) or --all-open to {verb} every open row"
        )
    selection.pop("all_open", None)
    if not explicit and not selection["statuses"]:
        selection["statuses"] = ("open",)
    settings = settings_of(ctx)
    store = cli_store(settings)
    try:
        rows = rows_to_act_on(store, _filter(ids, **selection))
        if not rows:
            click.echo(f"nothing to {verb}: no row matches", err=True)
            return
        reasons = Counter(r.reason for r in rows)
        summary = ", ".join(f"{n} {reason}" for reason, n in reasons.most_common())
        if not yes:
            click.confirm(
                f"{verb.capitalize()} {len(rows)} dead letter(s) ({summary})?", abort=True, err=True
            )
        if len(rows) == 1:
            done = act_on(settings, store, rows, act)
        else:
            label = f"{verb}ing"
            with click.progressbar(rows, label=label, file=sys.stderr, show_pos=True) as progress:
                done = act_on(settings, store, rows, act, lambda _: progress)
    finally:
        store.close()
    _report(verb, done, as_json)


def _report(verb: str, done: list[Handled], as_json: bool) -> None:
    if as_json:
        emit_json([{"id": d.row_id, "outcome": d.outcome, "detail": d.detail} for d in done])
        return
    counts = Counter(d.outcome for d in done)
    click.echo(f"{verb}: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())))
    for d in done:
        if d.detail:
            click.echo(f"  {d.row_id}: {d.outcome}: {d.detail}")


def bulk_options(fn: F) -> F:
    """Row IDs, filters, and the confirmation / output flags of bulk operations."""
    fn = click.option("--json", "as_json", is_flag=True, help="Report row by row in JSON.")(fn)
    fn = click.option("--yes", "-y", is_flag=True, help="Do not ask before acting.")(fn)
    fn = click.option("--all-open", is_flag=True, help="Every open row.")(fn)
    fn = filter_options(fn)
    return click.argument("ids", nargs=-1, type=int)(fn)


@dlq.command("retry")
@bulk_options
@click.option("--note", help="Why (kept on the row).")
@click.pass_context
def dlq_retry(
    ctx: click.Context,
    /,
    ids: tuple[int, ...],
    yes: bool,
    as_json: bool,
    note: str | None,
    **selection: Any,
) -> None:
    """Send rows' events back through their record's lane, from a fresh read.

    A row is retried once: a second retry queues nothing, and the event applies at most
    once. A row that holds its key (policy hold) runs first, then its parked events.
    """
    by = operator()
    _bulk(ctx, "retry", ids, yes, as_json, selection, retry(by, note))


@dlq.command("discard")
@bulk_options
@click.option("--note", help="Why (kept on the row).")
@click.pass_context
def dlq_discard(
    ctx: click.Context,
    /,
    ids: tuple[int, ...],
    yes: bool,
    as_json: bool,
    note: str | None,
    **selection: Any,
) -> None:
    """Close rows without applying their events (a held key is released)."""
    by = operator()
    _bulk(
        ctx,
        "discard",
        ids,
        yes,
        as_json,
        selection,
        discard(by, note),
    )


@dlq.command("resolve")
@bulk_options
@click.option("--note", required=True, help="What was done about it (kept on the row).")
@click.pass_context
def dlq_resolve(
    ctx: click.Context,
    /,
    ids: tuple[int, ...],
    yes: bool,
    as_json: bool,
    note: str,
    **selection: Any,
) -> None:
    """Close rows as handled by hand (e.g. fixed in the CRM); a held key is released."""
    by = operator()
    _bulk(
        ctx,
        "resolve",
        ids,
        yes,
        as_json,
        selection,
        resolve(by, note),
    )


@dlq.command("export")
@filter_options
@click.option("--all", "all_statuses", is_flag=True, help="Rows in any status (default: open).")
@click.option(
    "--output",
    "-o",
    type=click.File("w"),
    default="-",
    show_default=True,
    help="Where to write the JSON lines.",
)
@click.pass_context
def dlq_export(ctx: click.Context, /, all_statuses: bool, output: Any, **selection: Any) -> None:
    """Write rows as JSON lines (one row per line, with the record as it is now)."""
    if not selection["statuses"] and not all_statuses:
        selection["statuses"] = ("open",)
    store = cli_store(settings_of(ctx))
    try:
        rows = store.dead_letters(_filter((), **selection))
        for row in rows:
            record = store.read(row.record_key)
            line = {
                **dead_letter_json(row),
                "record_now": {"revision": record.revision, "fields": record.fields},
            }
            output.write(json.dumps(line, sort_keys=True, default=str) + "\n")
    finally:
        store.close()
    click.echo(f"exported {len(rows)} row(s)", err=True)


@dlq.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def dlq_stats(ctx: click.Context, /, as_json: bool) -> None:
    """Counts by status, open rows by reason and source, and the oldest open row's age."""
    summary = dead_letter_stats(settings_of(ctx))
    if as_json:
        emit_json(summary)
        return
    click.echo(render_table(["status", "rows"], sorted(summary["by_status"].items())))
    click.echo("")
    click.echo(render_table(["open by reason", "rows"], sorted(summary["open_by_reason"].items())))
    click.echo("")
    click.echo(render_table(["open by source", "rows"], sorted(summary["open_by_source"].items())))
    oldest = summary["oldest_open_age_s"]
    click.echo(f"\noldest open row: {'-' if oldest is None else f'{oldest:.0f}s old'}")

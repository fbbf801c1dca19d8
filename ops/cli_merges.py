"""``keylane merges``: the merges a person decides (ops/merge_review.py says how)."""

from __future__ import annotations

import time
from collections.abc import Callable

import click

from ..routing.contract.identities import IdentityRule
from ..workers.store import JournalStore
from ..workers.store_rows import MERGE_REVIEW, DeadLetterFilter
from .archive import Archive
from .cli_common import cli_store, emit_json, operator, settings_of, when
from .merge_review import MergeSides, keep_apart, merge_lines, open_review, parse_take, resolve
from .reconcile import Reconciled, by_field, by_function, outcomes, reconcile
from .tables import render_table
from .triage import Handled, open_triage_broker
from .undo_merge import UndoReport, undo, wait_undone


@click.group(invoke_without_command=True)
@click.pass_context
def merges(ctx: click.Context) -> None:
    """Merges waiting for a person: list, show, resolve (a side per field), apart; undo a
    merge applied; reconcile records that share a stable key (alone: the open reviews, as
    ``merges list``)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(merges_list)


@merges.command("list")
@click.option("--all", "all_statuses", is_flag=True, help="Closed reviews too (default: open).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def merges_list(ctx: click.Context, all_statuses: bool, as_json: bool) -> None:
    """Merge reviews, oldest first: the two records and the fields that differ."""
    store = cli_store(settings_of(ctx))
    try:
        statuses = () if all_statuses else ("open",)
        rows = store.dead_letters(DeadLetterFilter(statuses=statuses, reasons=(MERGE_REVIEW,)))
    finally:
        store.close()
    found = [MergeSides.of(row) for row in rows]
    if as_json:
        emit_json([sides.as_json() for sides in found])
        return
    table = [
        (
            s.row.id,
            when(s.row.created_at),
            s.row.status,
            s.absorbed,
            s.survivor,
            ", ".join(s.differ),
        )
        for s in found
    ]
    click.echo(render_table(["id", "created", "status", "absorbed", "survivor", "differ"], table))


@merges.command("show")
@click.argument("row_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def merges_show(ctx: click.Context, row_id: int, as_json: bool) -> None:
    """One merge review: both records side by side as they were compared (``*``: the
    fields that differ)."""
    store = cli_store(settings_of(ctx))
    try:
        sides = open_review(store, row_id)
    finally:
        store.close()
    if as_json:
        emit_json(sides.as_json())
        return
    click.echo(f"merge review {row_id} ({sides.row.status}): {sides.row.error}")
    click.echo("\n".join(merge_lines(sides)))


@merges.command("resolve")
@click.argument("row_id", type=int)
@click.option(
    "--take",
    "take",
    multiple=True,
    metavar="FIELD=SIDE",
    help="The side whose value a differing field keeps: absorbed or survivor (repeatable).",
)
@click.option(
    "--take-all",
    type=click.Choice(["absorbed", "survivor"]),
    help="The side of every differing field not named by --take.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def merges_resolve(
    ctx: click.Context, row_id: int, take: tuple[str, ...], take_all: str | None, as_json: bool
) -> None:
    """Merge the two records with a side chosen for each field that differs: the close
    goes again through the absorbed record's lane, then the survivor's lane absorbs."""
    settings = settings_of(ctx)
    store = cli_store(settings)
    try:
        sides = open_review(store, row_id)
        chosen = parse_take(take, take_all, sides)
        broker = open_triage_broker(settings, store)
        try:
            handled = resolve(store, broker, sides, chosen, operator())
        finally:
            broker.close()
    finally:
        store.close()
    _report(handled, as_json)


@merges.command("apart")
@click.argument("row_id", type=int)
@click.option("--note", help="Why they are two (kept on the row).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def merges_apart(ctx: click.Context, row_id: int, note: str | None, as_json: bool) -> None:
    """Keep the two records apart for good: no merge of them is proposed again."""
    store = cli_store(settings_of(ctx))
    try:
        handled = keep_apart(store, store, open_review(store, row_id), operator(), note)
    finally:
        store.close()
    _report(handled, as_json)


@merges.command("undo")
@click.argument("record_key")
@click.option(
    "--wait",
    "wait_s",
    type=click.IntRange(0),
    default=30,
    show_default=True,
    help="Wait up to this many seconds for the survivor's release, and say what it gave "
    "back (0: queue the undo and return).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def merges_undo(ctx: click.Context, record_key: str, wait_s: int, as_json: bool) -> None:
    """Undo the merge of RECORD_KEY (a record merged into another) through both lanes:
    it is live again, its survivor gives each field the merge took back to what it held
    before (its own value, or none) and the identities that came with it, and the two are
    kept apart for good. A field changed since the merge keeps its later value, and one
    whose value before nothing says is left as it is: each is said, with why. Events
    applied to the survivor meanwhile stay there.

    Exit code 0 when released (or queued, with --wait 0), 1 when not released in time or
    not undone."""
    settings = settings_of(ctx)
    store = cli_store(settings)
    try:
        broker = open_triage_broker(settings, store)
        try:
            archive = Archive(settings.archive_path)
            undoing = undo(store, store, store, archive, broker, record_key)
        finally:
            broker.close()
        report = UndoReport.of(undoing, wait_undone(store, undoing, wait_s), wait_s)
    finally:
        store.close()
    if as_json:
        emit_json(report.as_json())
    else:
        click.echo("\n".join(report.lines()))
    raise SystemExit(report.exit_code)


@merges.command("reconcile")
@click.option("--prefix", default="", help="Only records whose keys start with this.")
@click.option("--by", "by", metavar="FIELD", help="Group by this field's value, normalised.")
@click.option(
    "--rule",
    type=click.Choice(["email", "phone", "lower", "exact"]),
    help="How --by's values are normalised (default: by the field's name for email and "
    "phone, else exact).",
)
@click.option(
    "--key",
    "key_path",
    metavar="MODULE:FUNCTION",
    help="Group by what your function returns for (record key, fields); None: no group.",
)
@click.option("--dry-run", is_flag=True, help="List the pairs; queue nothing.")
@click.option(
    "--wait",
    "wait_s",
    type=click.IntRange(0),
    default=0,
    help="Wait up to this many seconds for the lanes to decide the merges, and count them.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def merges_reconcile(
    ctx: click.Context,
    prefix: str,
    by: str | None,
    rule: IdentityRule | None,
    key_path: str | None,
    dry_run: bool,
    wait_s: int,
    as_json: bool,
) -> None:
    """Find live records that share a stable key and propose their merges through the
    lanes (the older survives; differing fields make a review row). Safe to run again."""
    if (by is None) == (key_path is None):
        raise click.UsageError("give --by FIELD or --key MODULE:FUNCTION (one of them)")
    stable_key = by_field(by, rule) if by is not None else by_function(str(key_path))
    settings = settings_of(ctx)
    store = cli_store(settings)
    try:
        broker = None if dry_run else open_triage_broker(settings, store)
        try:
            found = reconcile(
                broker,
                stable_key,
                prefix,
                _progress(as_json),
                records=store,
                identities=store,
                journal=store,
            )
        finally:
            if broker is not None:
                broker.close()
        decided = _decided(store, found, wait_s) if wait_s and not dry_run else None
    finally:
        store.close()
    summary = {
        "scanned": found.scanned,
        "keyed": found.keyed,
        "groups": found.groups,
        "proposed": len(found.proposed),
        "kept_apart": found.kept_apart,
        "decided_before": found.decided_before,
        "seconds": round(found.seconds, 3),
        "records_per_s": round(found.records_per_s),
        "outcomes": decided,
    }
    if as_json:
        emit_json({**summary, "pairs": found.proposed if dry_run else None})
        return
    if dry_run:
        for pair in found.proposed:
            click.echo(pair)
    click.echo(
        f"scanned {found.scanned:,} live records in {found.seconds:.1f} s "
        f"({found.records_per_s:,.0f}/s): {found.groups:,} stable keys held by more than one; "
        f"{len(found.proposed):,} merges {'found' if dry_run else 'proposed'}, "
        f"{found.kept_apart:,} pairs kept apart, {found.decided_before:,} decided before"
    )
    if decided is not None:
        click.echo(
            f"decided: {decided['merged']:,} merged, {decided['reviewed']:,} waiting for a "
            f"person (keylane merges list), {decided['not_merged']:,} not merged, "
            f"{decided['pending']:,} still pending"
        )


def _progress(quiet: bool) -> Callable[[Reconciled], None] | None:
    if quiet:
        return None

    def show(found: Reconciled) -> None:
        click.echo(
            f"  ... {found.scanned:,} records read, {len(found.proposed):,} merges so far",
            err=True,
        )

    return show


def _decided(store: JournalStore, found: Reconciled, wait_s: int) -> dict[str, int]:
    deadline = time.monotonic() + wait_s
    while True:
        counts = outcomes(store, found.proposed)
        if counts["pending"] == 0 or time.monotonic() >= deadline:
            return counts
        time.sleep(0.5)


def _report(handled: Handled, as_json: bool) -> None:
    if as_json:
        emit_json({"id": handled.row_id, "outcome": handled.outcome, "detail": handled.detail})
        return
    detail = f" ({handled.detail})" if handled.detail else ""
    click.echo(f"{handled.row_id}: {handled.outcome}{detail}")

"""``keylane deliveries``: the deliveries kept (``ops/docs/deliveries.md``): those the
receiver turned away at the door (invalid, unverified, throttled, overloaded) or found no
mapping for (ignored), in a bounded Redis stream per source, and the accepted ones a
source's window keeps, in the store with the events they became. What is read:
``ops/deliveries.py``; printed: here."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from .cli_common import cli_store, emit_json, parse_age, settings_of, when
from .deliveries import (
    OUTCOMES,
    STATUSES,
    DeliveryQuery,
    body_kept,
    list_deliveries,
    public,
    show_delivery,
)
from .tables import render_table

if TYPE_CHECKING:
    from .rerun import Rerun


@click.group("deliveries", invoke_without_command=True)
@click.pass_context
def deliveries(ctx: click.Context) -> None:
    """Deliveries kept (turned away, ignored, accepted): list, show, rerun (alone: the
    list, as ``deliveries list``)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_command)


@deliveries.command("list")
@click.option("--source", "sources", multiple=True, help="Only this source (repeatable).")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    help=f"Only this status: a name ({', '.join(STATUSES)}) or an HTTP status (repeatable).",
)
@click.option(
    "--outcome",
    "outcomes",
    multiple=True,
    type=click.Choice(OUTCOMES),
    help="Only deliveries one of whose events had this outcome (repeatable).",
)
@click.option("--since", default=None, help="Only the newer than this: 90s, 15m, 2h, 3d.")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--before", default=None, help="The next page: the ID the last page ended at.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def list_command(
    ctx: click.Context,
    sources: tuple[str, ...] = (),
    statuses: tuple[str, ...] = (),
    since: str | None = None,
    limit: int = 20,
    before: str | None = None,
    as_json: bool = False,
    outcomes: tuple[str, ...] = (),
) -> None:
    """The deliveries kept, newest first: when, the source, the status (``202 accepted``,
    ``200 ignored``, ``400 invalid``, ``401 unverified``, ``429 throttled``, ``503
    overloaded``...), its code, and the detail (an accepted one's: its events'
    outcomes). ``--before ID`` shows the page after the one that ended at ID."""
    age = None if since is None else parse_age(since)
    query = DeliveryQuery(sources, statuses, age, limit, before, outcomes)
    found = list_deliveries(settings_of(ctx), query)
    page, more = found.entries, found.next_before
    if as_json:
        emit_json({"deliveries": [public(e) for e in page], "next_before": more})
        return
    if not page:
        filtered = statuses or since or outcomes or sources
        click.echo("no deliveries kept" + (" (of these)" if filtered else ""))
        return
    rows = [
        (
            e["id"],
            when(e["at_ms"] / 1000),
            f"{e['status']} {e['status_name']}",
            e["code"],
            e["detail"],
        )
        for e in page
    ]
    click.echo(render_table(["id", "at (utc)", "status", "code", "detail"], rows))
    if more is not None:
        click.echo(f"more: keylane deliveries list --before {more}")


@deliveries.command("show")
@click.argument("delivery_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--body", "with_body", is_flag=True, help="Print the body kept.")
@click.pass_context
def show(ctx: click.Context, delivery_id: str, as_json: bool, with_body: bool) -> None:
    """The delivery ID (``SOURCE/MS-SEQ``, as ``deliveries list`` names it): its request
    (headers redacted), how it was verified, the answer (turned away) or the events it
    became and each one's outcome (accepted), the body's size and SHA-256; ``--body``:
    the body kept (none for an unverified one)."""
    entry = show_delivery(settings_of(ctx), delivery_id)
    if as_json:
        emit_json(public(entry, with_body))
    elif with_body:
        sys.stdout.buffer.write(entry["body"] or b"")
        sys.stdout.flush()
    else:
        _print(entry)


def _print(e: dict[str, Any]) -> None:
    query = f"?{e['query']}" if e["query"] else ""
    click.echo(f"{e['id']}  {when(e['at_ms'] / 1000)} UTC")
    if e["kind"] == "accepted":
        click.echo(f"  answered: 202 accepted: {len(e['events'])} event(s), {e['detail']}")
    else:
        click.echo(f"  answered: {e['status']} {e['status_name']} ({e['code']}): {e['detail']}")
    click.echo(f"  request:  {e['method']} {e['path']}{query}")
    verified_by = f" ({e['verified_by']})" if e.get("verified_by") else ""
    click.echo(f"  verified: {'yes' if e['verified'] else 'no'}{verified_by}")
    click.echo(f"  body:     {e['size']} bytes, sha256 {e['sha256'] or '-'}, {_kept(e)}")
    click.echo("  headers:")
    for name, value in e["headers"].items():
        click.echo(f"    {name}: {value}")
    if e["kind"] == "accepted":
        _print_events(e["events"])


def _print_events(events: list[dict[str, Any]]) -> None:
    click.echo("  events:")
    if not events:
        click.echo("    (none in the journal's table: archived)")
    rows = [
        (
            ev["event_id"],
            ev["record_key"],
            ev["outcome"],
            "" if ev["revision"] is None else ev["revision"],
            ", ".join(f"#{d['id']} {d['reason']} ({d['status']})" for d in ev["dead_letters"]),
        )
        for ev in events
    ]
    if rows:
        table = render_table(["event_id", "record_key", "outcome", "revision", "dead letter"], rows)
        click.echo("\n".join("    " + line for line in table.splitlines()))


def _kept(e: dict[str, Any]) -> str:
    said = body_kept(e)
    return f"{said} (--body)" if e["body_kept"] else said


@deliveries.command("rerun")
@click.argument("delivery_ids", metavar="[ID]...", nargs=-1)
@click.option(
    "--source", "sources", multiple=True, help="Every kept one of this source (repeatable)."
)
@click.option(
    "--status",
    "statuses",
    multiple=True,
    help="Every kept one of this status: a name or an HTTP status (repeatable).",
)
@click.option("--since", default=None, help="Every kept one newer than this: 90s, 15m, 2h, 3d.")
@click.option(
    "--limit",
    type=click.IntRange(1, 10_000),
    default=100,
    show_default=True,
    help="The most deliveries a filter runs again.",
)
@click.option(
    "--dry-run", is_flag=True, help="Map each one and say what would be queued; queue nothing."
)
@click.option(
    "--new-ids",
    is_flag=True,
    help="Give each event a new id (<id>:rerun-<ms>), so that it is applied even when its "
    "id was applied before.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def rerun_command(
    ctx: click.Context,
    delivery_ids: tuple[str, ...],
    sources: tuple[str, ...],
    statuses: tuple[str, ...],
    since: str | None,
    limit: int,
    dry_run: bool,
    new_ids: bool,
    as_json: bool,
) -> None:
    """Run kept deliveries (each ID, or every one a filter matches, oldest first) again
    through their source's current mapping: after a mapping is fixed. Each event is
    deduped on its id as any delivery's is: one accepted before is a duplicate and is
    not applied again unless --new-ids. Exit code 1 when any delivery was refused or
    cannot be run again (its body was not kept whole)."""
    # Here, not at the top: the receiver's modules are what a rerun runs, and `deliveries
    # list` and `show` do without them.
    from .rerun import check_choice, chosen, rerun
    from .rerun import public as public_rerun

    check_choice(delivery_ids, bool(sources or statuses or since))
    settings = settings_of(ctx)
    query = None
    if not delivery_ids:
        query = DeliveryQuery(sources, statuses, None if since is None else parse_age(since))
    entries = chosen(settings, delivery_ids, query, limit)
    store = cli_store(settings) if dry_run else None
    try:
        done = rerun(settings, entries, dry_run, new_ids, store)
    finally:
        if store is not None:
            store.close()
    if as_json:
        emit_json(
            {"dry_run": dry_run, "new_ids": new_ids, "deliveries": [public_rerun(d) for d in done]}
        )
    else:
        for one in done:
            _print_rerun(one, dry_run)
        if not done:
            click.echo("no deliveries kept match")
    raise SystemExit(1 if any(d.failed for d in done) else 0)


RESULT_WORDS = {
    "new": "new: queued, it will be applied",
    "duplicate": "duplicate: accepted before, not applied again",
    "reused": "its id came before with another body: recorded for review, not applied",
    "ignored": "ignored: the mapping maps nothing for it",
}
DRY_WORDS = {
    "new": "would be new: queued and applied",
    "duplicate": "would be a duplicate: the journal has it, not applied again",
    "ignored": "would be ignored: the mapping maps nothing for it",
}


def _print_rerun(one: Rerun, dry_run: bool) -> None:
    status = f" {one.status}" if one.status is not None else ""
    reason = f": {one.reason}" if one.reason else ""
    count = f", {len(one.events)} event(s)" if one.events else ""
    click.echo(f"{one.delivery}  {one.verdict}{status}{count}{reason}")
    words = DRY_WORDS if dry_run else RESULT_WORDS
    for event in one.events:
        before = f" (the first was {event.before.replace('_', ' ')})" if event.before else ""
        said = words.get(event.result, event.result)
        if event.event_id is None:
            click.echo(f"  {event.event_type}: {said} ({event.reason})")
            continue
        click.echo(f"  {event.event_id}  {event.record_key}  {said}{before}")
        if dry_run and event.changes:
            click.echo(f"    changes: {json.dumps(event.changes, sort_keys=True)}")

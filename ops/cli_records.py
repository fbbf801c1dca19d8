"""``keylane records``: list records, read one, or edit one from outside the lanes."""

from __future__ import annotations

import json
import shlex

import click

from ..workers.store_rows import RecordPage, RecordQuery
from .cli_common import cli_store, emit_json, settings_of, when
from .outside_edit import edit_record, parse_assignment, record_json
from .records_read import get_record, list_records
from .tables import render_table

MAX_LIST_LIMIT = 1000


@click.group(invoke_without_command=True)
@click.pass_context
def records(ctx: click.Context) -> None:
    """List records, read one, or edit one from outside the lanes (alone: the first page
    of the list, as ``records list``)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(records_list)


@records.command("list")
@click.option("--prefix", default="", help="Only keys that start with this text (crm:).")
@click.option(
    "--where",
    "where",
    multiple=True,
    metavar="FIELD=VALUE",
    help="Only records whose FIELD equals VALUE (JSON if it parses, else text; repeatable: "
    "all must hold).",
)
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIST_LIMIT),
    default=50,
    show_default=True,
    help="Records per page.",
)
@click.option("--after", default="", metavar="KEY", help="Start after this key (the next page).")
@click.option("--merged", is_flag=True, help="Also list records merged into another (tombstones).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the records and the next page.")
@click.pass_context
def records_list(
    ctx: click.Context,
    prefix: str = "",
    where: tuple[str, ...] = (),
    limit: int = 50,
    after: str = "",
    merged: bool = False,
    as_json: bool = False,
) -> None:
    """Records in key order, a page at a time: key, revision, when updated, and the
    fields (cut short; ``records get KEY`` shows them whole). A record merged into
    another (a tombstone) is left out unless ``--merged``: its events go to the record
    that absorbed it. The text ends with the command for the next page when there is
    one; ``--json`` prints ``records`` and ``next_after``."""
    query = RecordQuery(
        prefix=prefix,
        where=tuple(parse_assignment(w) for w in where),
        after=after,
        limit=limit,
        merged=merged,
    )
    page = list_records(settings_of(ctx), query)
    if as_json:
        emit_json(
            {"records": [record_json(r) for r in page.records], "next_after": page.next_after}
        )
        return
    _print_page(page, merged)
    if page.next_after is not None:
        click.echo(f"next page: {_next_command(prefix, where, limit, page.next_after, merged)}")


def _print_page(page: RecordPage, merged: bool) -> None:
    if not page.records:
        click.echo("no records")
        return
    headers = ["key", "revision", "updated", *(["merged_into"] if merged else []), "fields"]
    rows = []
    for record in page.records:
        shown = " ".join(f"{k}={json.dumps(record.fields[k])}" for k in sorted(record.fields))
        row = [record.key, record.revision, when(record.updated_at)]
        rows.append([*row, *([record.merged_into] if merged else []), shown])
    click.echo(render_table(headers, rows))


def _next_command(prefix: str, where: tuple[str, ...], limit: int, after: str, merged: bool) -> str:
    words = ["keylane", "records", "list"]
    if prefix:
        words += ["--prefix", prefix]
    for condition in where:
        words += ["--where", condition]
    if limit != 50:
        words += ["--limit", str(limit)]
    if merged:
        words.append("--merged")
    return " ".join(shlex.quote(w) for w in [*words, "--after", after])


@records.command("get")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def records_get(ctx: click.Context, key: str, as_json: bool) -> None:
    """Print the record KEY with its revision and identities (exit code 1 if there is
    none, with --json too: it prints the record as absent, ``"exists": false``). A record
    merged into another says which, and since when."""
    shown = get_record(settings_of(ctx), key)
    record, identities = shown.record, shown.identities
    if as_json:
        emit_json(record_json(record, identities))
        if not record.exists:
            raise SystemExit(1)
        return
    if not record.exists:
        click.echo(f"{key}: no such record")
        raise SystemExit(1)
    click.echo(f"{key}  revision {record.revision}  updated {when(record.updated_at)}")
    if record.merged_into is not None:
        click.echo(
            f"  merged into {record.merged_into} {when(record.updated_at)}: its events go "
            "there; the fields below are as they were then"
        )
    if identities:
        click.echo(f"  identities: {', '.join(identities)}")
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

    The write is revision-checked and advances the revision; a lane that read the record
    before this edit re-applies its change on top of it.
    """
    if not assignments and not unset:
        raise click.UsageError("give at least one FIELD=VALUE or --unset FIELD")
    assign = dict(parse_assignment(a) for a in assignments)
    store = cli_store(settings_of(ctx))
    try:
        record = edit_record(store, key, assign, list(unset))
    finally:
        store.close()
    if as_json:
        emit_json(record_json(record))
    else:
        click.echo(f"{key}: revision {record.revision}")

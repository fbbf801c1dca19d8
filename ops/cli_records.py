"""``keylane records``: read a record, or edit it from outside the lanes."""

from __future__ import annotations

import json

import click

from .cli_common import cli_store, emit_json, settings_of, when
from .outside_edit import edit_record, parse_assignment, record_json


@click.group()
def records() -> None:
    """Read records, or edit them from outside the lanes."""


@records.command("get")
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def records_get(ctx: click.Context, key: str, as_json: bool) -> None:
    """Print the record KEY with its revision and identities (exit code 1 if there is
    none, with --json too: it prints the record as absent, ``"exists": false``). A record
    merged into another says which, and since when."""
    store = cli_store(settings_of(ctx))
    try:
        record = store.read(key)
        identities = store.identities_of(key)
    finally:
        store.close()
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

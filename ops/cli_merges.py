"""``keylane merges``: the merges a person decides (ops/merge_review.py says how)."""

from __future__ import annotations

import click

from ..workers.merges import MERGE_REVIEW
from ..workers.store import DeadLetterFilter
from .cli_common import cli_store, emit_json, operator, settings_of, when
from .merge_review import (
    MergeSides,
    keep_apart,
    merge_lines,
    open_review,
    parse_take,
    resolve,
)
from .tables import render_table
from .triage import Handled, open_triage_broker


@click.group()
def merges() -> None:
    """Merges waiting for a person: list, show, resolve (a side per field), apart."""


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
        handled = keep_apart(store, open_review(store, row_id), operator(), note)
    finally:
        store.close()
    _report(handled, as_json)


def _report(handled: Handled, as_json: bool) -> None:
    if as_json:
        emit_json({"id": handled.row_id, "outcome": handled.outcome, "detail": handled.detail})
        return
    detail = f" ({handled.detail})" if handled.detail else ""
    click.echo(f"{handled.row_id}: {handled.outcome}{detail}")

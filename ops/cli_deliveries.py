"""``keylane deliveries``: the deliveries the receiver turned away at the door (invalid,
unverified, throttled, overloaded), as it kept them in a bounded Redis stream per source
(``ops/docs/deliveries.md``; what an entry holds: ``routing/contract/door.py``)."""

from __future__ import annotations

import base64
import re
import sys
import time
from typing import Any

import click

from ..routing.contract.door import NAMES, read_entry
from ..routing.contract.errors import KeylaneError
from ..routing.contract.sources import load_sources
from .cli_common import emit_json, parse_age, settings_of, when
from .deployment_view import DeploymentView
from .tables import render_table

#: How many entries one XREVRANGE reads while looking for those a filter wants.
PAGE = 200


@click.group("deliveries", invoke_without_command=True)
@click.pass_context
def deliveries(ctx: click.Context) -> None:
    """Deliveries the receiver turned away: list, show (alone: the list, as
    ``deliveries list``)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_command)


@deliveries.command("list")
@click.option("--source", "sources", multiple=True, help="Only this source (repeatable).")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    help=f"Only this status: a name ({', '.join(NAMES)}) or an HTTP status (repeatable).",
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
) -> None:
    """The deliveries turned away, newest first: when, the source, the status answered
    (``400 invalid``, ``401 unverified``, ``429 throttled``, ``503 overloaded``...), its
    code and detail. ``--before ID`` shows the page after the one that ended at ID."""
    settings = settings_of(ctx)
    names = list(sources) or load_sources(settings).names()
    wanted = _statuses(statuses)
    oldest = "-" if since is None else str(int((time.time() - parse_age(since)) * 1000))
    start = "+" if before is None else "(" + _delivery_id(before)[1]
    view = DeploymentView.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    try:
        found = [e for name in names for e in _matching(view, name, start, oldest, wanted, limit)]
    finally:
        view.close()
    found.sort(key=lambda e: _order(e["id"]), reverse=True)
    page = found[:limit]
    more = page[-1]["id"] if len(found) > limit or len(page) == limit else None
    if as_json:
        emit_json({"deliveries": [_public(e) for e in page], "next_before": more})
        return
    if not page:
        click.echo("no deliveries turned away" + (" (of these)" if statuses or since else ""))
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
    """The delivery ID (``SOURCE/STREAM-ID``, as ``deliveries list`` names it): its
    request (headers redacted), the answer, the body's size and SHA-256; ``--body``: the
    body kept (none for an unverified one)."""
    source, entry_id = _delivery_id(delivery_id)
    settings = settings_of(ctx)
    view = DeploymentView.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    try:
        fields = view.door_entry(source, entry_id)
    finally:
        view.close()
    if fields is None:
        raise KeylaneError(f"no delivery {delivery_id} kept (past the bound, or never)")
    entry = read_entry(source, entry_id, fields)
    if as_json:
        emit_json(_public(entry, with_body))
    elif with_body:
        sys.stdout.buffer.write(entry["body"] or b"")
        sys.stdout.flush()
    else:
        _print(entry)


def _statuses(given: tuple[str, ...]) -> set[str]:
    for value in given:
        if value not in NAMES and not value.isdigit():
            raise KeylaneError(f"--status {value}: a name ({', '.join(NAMES)}) or an HTTP status")
    return set(given)


def _matching(
    view: DeploymentView, source: str, start: str, oldest: str, wanted: set[str], limit: int
) -> list[dict[str, Any]]:
    """Up to ``limit`` entries of ``source``'s stream from ``start`` that ``wanted`` takes."""
    found: list[dict[str, Any]] = []
    while len(found) < limit:
        page = view.door_page(source, start, oldest, PAGE)
        for entry_id, fields in page:
            entry = read_entry(source, entry_id, fields)
            if not wanted or {entry["status_name"], str(entry["status"])} & wanted:
                found.append(entry)
        if len(page) < PAGE:
            break
        start = "(" + page[-1][0]
    return found[:limit]


def _order(delivery_id: str) -> tuple[int, int]:
    ms, _, seq = delivery_id.rpartition("/")[2].partition("-")
    return int(ms), int(seq or 0)


def _public(entry: dict[str, Any], with_body: bool = False) -> dict[str, Any]:
    """``entry`` for JSON: the body as text (``body``) or, not UTF-8, as ``body_base64``."""
    shown = {k: v for k, v in entry.items() if k != "body"}
    body: bytes | None = entry["body"]
    if with_body and body is not None:
        try:
            shown["body"] = body.decode()
        except UnicodeDecodeError:
            shown["body_base64"] = base64.b64encode(body).decode()
    return shown


def _print(e: dict[str, Any]) -> None:
    query = f"?{e['query']}" if e["query"] else ""
    click.echo(f"{e['id']}  {when(e['at_ms'] / 1000)} UTC")
    click.echo(f"  answered: {e['status']} {e['status_name']} ({e['code']}): {e['detail']}")
    click.echo(f"  request:  {e['method']} {e['path']}{query}")
    click.echo(f"  verified: {'yes' if e['verified'] else 'no'}")
    click.echo(f"  body:     {e['size']} bytes, sha256 {e['sha256'] or '-'}, {_kept(e)}")
    click.echo("  headers:")
    for name, value in e["headers"].items():
        click.echo(f"    {name}: {value}")


def _kept(e: dict[str, Any]) -> str:
    if not e["sha256"]:
        return "not read (refused before its body was)"
    if not e["verified"]:
        return "not kept (unverified: metadata only)"
    if e["body_cut"]:
        return f"the first {e['body_kept']} bytes kept (--body)"
    return "kept whole (--body)" if e["size"] else "empty"


STREAM_ID = re.compile(r"\d+(-\d+)?")


def _delivery_id(text: str) -> tuple[str, str]:
    """``SOURCE/STREAM-ID`` as its source and stream id; a clear error for anything else
    (Redis would refuse it, and its refusal reads as Redis being down)."""
    source, _, entry_id = text.rpartition("/")
    if not source or not STREAM_ID.fullmatch(entry_id):
        raise KeylaneError(f"not a delivery id: {text!r} (SOURCE/STREAM-ID, as listed)")
    return source, entry_id

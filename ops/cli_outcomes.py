"""``keylane outcome``: what became of one sender event, as keylane tells it
(``ops/docs/outcomes.md``): the told outcome the lane wrote to Redis, or, when Redis has
none (past its retention, on RabbitMQ without the Redis helper), what the journal says."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import click

from ..producers.gateway import ReceiverGateway
from ..producers.outcome_reads import read_told, retention_of
from ..producers.outcome_waits import OutcomeWaits
from ..routing.contract.outcomes import HTTP_STATUS, decode_told
from ..routing.contract.settings import Settings
from ..routing.contract.sources import load_sources
from .archive import Archive
from .cli_common import cli_store, emit_json, settings_of, when
from .lookup import find_events

#: The exit code of each answer (``keylane outcome --help`` lists them).
EXIT_DECIDED, EXIT_PENDING, EXIT_UNKNOWN = 0, 1, 3


@dataclass(frozen=True)
class Answer:
    """The outcome found: ``status`` is a told one, ``pending`` or ``unknown``; ``came_from``
    says where it was read (``redis``, ``journal``, or None when nowhere)."""

    status: str
    came_from: str | None
    fields: dict[str, Any]

    @property
    def exit_code(self) -> int:
        """0 decided, 1 pending, 3 unknown."""
        if self.status in HTTP_STATUS:
            return EXIT_DECIDED
        return EXIT_PENDING if self.status == "pending" else EXIT_UNKNOWN


@click.command("outcome")
@click.argument("source")
@click.argument("event_id")
@click.option(
    "--wait",
    "wait_s",
    type=click.IntRange(0),
    default=None,
    help="Wait up to this many seconds for an accepted event's outcome (capped by "
    "KEYLANE_OUTCOME_WAIT_MAX_S).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def outcome(
    ctx: click.Context, source: str, event_id: str, wait_s: int | None, as_json: bool
) -> None:
    """The outcome of SOURCE's event EVENT_ID: applied (at which revision, with its
    result), refused (the condition, the value seen) or dead-lettered (its review row), as
    the lane told it in Redis; when Redis has none, what the journal says.

    Exit code 0 when decided (told, or found in the journal), 1 when accepted and not
    decided yet (nor within --wait), 3 when keylane knows nothing of it (never accepted,
    or past its retention), 2 on an error (Redis or the store unreachable).
    """
    settings = settings_of(ctx)
    if wait_s is not None:
        wait_s = min(wait_s, settings.outcome_wait_max_s)
    told, accepted = asyncio.run(_read(settings, source, event_id, wait_s))
    if told is not None:
        body = decode_told(told)
        answer = Answer(body.status, "redis", json.loads(told))
    else:
        answer = _from_journal(settings, source, event_id, accepted)
    if as_json:
        emit_json({"from": answer.came_from, **answer.fields, "status": answer.status})
    else:
        _print(answer, source, event_id)
    raise SystemExit(answer.exit_code)


async def _read(
    settings: Settings, source: str, event_id: str, wait_s: int | None
) -> tuple[bytes | None, bool]:
    gateway = ReceiverGateway.from_settings(settings)
    waits = OutcomeWaits(gateway.outcome_feed)
    try:
        retention_s = retention_of(load_sources(settings), source, settings)
        return await read_told(gateway, waits, source, event_id, wait_s, retention_s)
    finally:
        await waits.close()
        await gateway.close()


def _from_journal(settings: Settings, source: str, event_id: str, accepted: bool) -> Answer:
    """Redis tells nothing: the journal's newest decided row of the event, if any."""
    store = cli_store(settings)
    try:
        lookup = find_events(store, Archive(settings.archive_path), event_id, source)
    finally:
        store.close()
    rows = [f for f in lookup.found if f.row.get("outcome") in HTTP_STATUS]
    names = {"source": source, "event_id": event_id}
    if not rows:
        return Answer("pending" if accepted else "unknown", "redis" if accepted else None, names)
    found = max(rows, key=lambda f: f.row.get("recorded_at") or 0)
    keep = ("record_key", "revision", "result", "recorded_at")
    fields = {**names, **{k: found.row.get(k) for k in keep}, "where": found.where}
    return Answer(str(found.row["outcome"]), "journal", fields)


def _print(answer: Answer, source: str, event_id: str) -> None:
    f = answer.fields
    name = f"{source}/{event_id}"
    if answer.status == "pending":
        click.echo(f"{name}: accepted, not decided yet (exit code 1)")
        return
    if answer.status == "unknown":
        click.echo(f"{name}: unknown: never accepted, or past its retention (exit code 3)")
        return
    revision = "" if f.get("revision") is None else f" at revision {f['revision']}"
    click.echo(f"{name}: {answer.status}{revision} (record {f.get('record_key')})")
    if answer.came_from == "journal":
        click.echo(
            f"  from the journal ({f.get('where')}, {when(f.get('recorded_at'))} UTC): "
            "Redis keeps no told outcome of it"
        )
    for key in ("reason", "dead_letter_id", "result"):
        if f.get(key) is not None:
            click.echo(f"  {key}: {json.dumps(f[key], separators=(',', ':'), default=str)}")

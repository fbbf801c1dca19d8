"""``keylane sources``: the sources of this deployment, what keylane would do with a
captured delivery (``sources try``), and the secret a sender handed over in its handshake
(``sources show-secret``, ``sources forget-secret``). See ``ops/docs/senders.md``."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import click

from ..producers.accept import new_event
from ..producers.answers import Answer
from ..producers.delivery import Taken, query_params, read_verified, target_of
from ..producers.formats import format_of
from ..producers.gateway import ReceiverGateway
from ..producers.handshakes import HANDOVER_HEADER, Handshakes, notion_token
from ..producers.intake import Ignored, Parts, load_hook
from ..producers.signatures import verifier_from_environ
from ..routing.contract.errors import ConfigError, InvalidEvent, SignatureError
from ..routing.contract.settings import Settings
from ..routing.contract.sources import SourceConfig, Sources, load_sources
from .captured import CapturedRequest, read_captured
from .cli_common import emit_json, settings_of
from .tables import render_table


@click.group("sources", invoke_without_command=True)
@click.pass_context
def sources(ctx: click.Context) -> None:
    """The sources of this deployment (alone: the list, as ``sources list``)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_sources)


@sources.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def list_sources(ctx: click.Context, as_json: bool = False) -> None:
    """Each source: its sender's scheme, body format, where its event id and type are,
    its batch items, handshake and how long its ids are remembered."""
    settings = settings_of(ctx)
    rows = [_summary(source, settings) for source in load_sources(settings).all()]
    if as_json:
        emit_json(rows)
        return
    headers = [
        "source",
        "scheme",
        "body",
        "event_id",
        "event_type",
        "items",
        "handshake",
        "retention_s",
    ]
    click.echo(render_table(headers, [[row[h] for h in headers] for row in rows]))


def _summary(source: SourceConfig, settings: Settings) -> dict[str, Any]:
    return {
        "source": source.name,
        "scheme": str(source.verify.scheme),
        "body": source.body_format,
        "event_id": source.event_id_rule,
        "event_type": source.event_type_rule,
        "items": source.items_rule,
        "handshake": source.handshake,
        "retention_s": source.retention(settings),
    }


@sources.command("try")
@click.argument("source_name", metavar="SOURCE")
@click.option(
    "--request",
    "request_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="A captured HTTP request: its request line, headers, a blank line, its body.",
)
@click.option(
    "--at",
    "at",
    type=float,
    default=None,
    help="Check a signed timestamp as of this Unix time (a request captured earlier is "
    "past its tolerance now).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def try_request(
    ctx: click.Context, source_name: str, request_file: Path, at: float | None, as_json: bool
) -> None:
    """What keylane would do with a captured delivery to SOURCE: verified or why not, and
    each event's id, type, record key, shard and changes; nothing is queued or recorded.

    Exit code 0 when it would be accepted (or answered as a handshake), 1 when it would
    be refused (the answer's status and why), 2 on an error (no such source, a secret not
    set, an unreadable file).
    """
    settings = settings_of(ctx)
    source = load_sources(settings).get(source_name)
    if source is None:
        raise ConfigError(f"no source named {source_name!r}")
    request = read_captured(request_file.read_bytes())
    report = _try(source, settings, request, at if at is not None else time.time())
    if as_json:
        emit_json(report)
    else:
        _print(report)
    raise SystemExit(0 if report["status"] < 400 else 1)


def _try(
    source: SourceConfig, settings: Settings, request: CapturedRequest, now: float
) -> dict[str, Any]:
    environ = os.environ
    verifier = verifier_from_environ(source.verify, environ)
    handshakes = Handshakes(Sources([source]), {source.name: verifier}, environ, None)
    headers, params = request.headers, query_params(request.query)
    base: dict[str, Any] = {"source": source.name, "scheme": str(source.verify.scheme)}
    if request.method == "GET":
        answer = asyncio.run(handshakes.get(source, params, verified=True))
        if answer is None:
            return {**base, "status": 405, "verdict": "refused", "reason": "no GET handshake"}
        return {**base, **_handshake(answer)}
    if source.handshake == "asana" and headers.get(HANDOVER_HEADER):
        return {
            **base,
            "status": 200,
            "verdict": "handshake",
            "reason": "Asana's handshake: its X-Hook-Secret would be kept and echoed",
        }
    if source.handshake == "notion" and notion_token(headers, request.body):
        return {
            **base,
            "status": 200,
            "verdict": "handshake",
            "reason": "Notion's handshake: answered, its verification_token kept unless "
            "secrets_env names it (`keylane sources show-secret` prints a kept one)",
        }
    if source.handshake == "graph" and "validationToken" in params:
        return {**base, "status": 200, "verdict": "handshake", "answer": params["validationToken"]}
    try:
        form = format_of(headers.get("content-type", ""), source.body_format)
        target = target_of(source, settings, request.path, request.query, params)
        read = read_verified(
            source,
            verifier,
            handshakes,
            Parts(request.body, headers, params, form),
            target,
            now,
            load_hook(source),
            settings.max_batch_items,
        )
    except SignatureError as exc:
        return {**base, "status": 401, "verdict": "unverified", "reason": str(exc)}
    except InvalidEvent as exc:
        return {**base, "status": exc.status, "verdict": exc.code, "reason": str(exc)}
    if isinstance(read, Answer):
        return {**base, **_handshake(read)}
    return {**base, **_events(source, settings, read)}


def _handshake(answer: Answer) -> dict[str, Any]:
    return {"status": answer.status, "verdict": "handshake", "answer": answer.body.decode()}


def _events(source: SourceConfig, settings: Settings, taken: Taken) -> dict[str, Any]:
    events = []
    for item in taken.events:
        if isinstance(item, Ignored):
            events.append(
                {"verdict": "ignored", "event_type": item.event_type, "reason": item.reason}
            )
            continue
        event = new_event(
            settings.shards,
            source=source.name,
            event_id=item.event_id,
            event_type=item.event_type,
            record_key=item.record_key,
            changes=item.changes,
            body_sha256=item.digest,
        )
        row: dict[str, Any] = {
            "verdict": "event",
            "event_id": item.event_id,
            "key_missing": item.key_missing,
            "event_type": item.event_type,
            "record_key": item.record_key,
            "shard": event.shard,
            "changes": item.changes,
            "conditions": item.conditions,
            "identities": list(item.identities),
        }
        events.append(row)
    verified = taken.verified
    return {
        "status": 202 if any(e["verdict"] == "event" for e in events) else 200,
        "verdict": "accepted",
        "verified_by": verified.scheme,
        "signed_event_id": verified.event_id,
        "events": events,
    }


def _print(report: dict[str, Any]) -> None:
    click.echo(f"{report['source']} ({report['scheme']}): {report['verdict']}, {report['status']}")
    if "reason" in report:
        click.echo(f"  {report['reason']}")
    if "answer" in report:
        click.echo(f"  answer: {report['answer']}")
    for n, event in enumerate(report.get("events", [])):
        if event["verdict"] == "ignored":
            click.echo(f"  #{n} ignored ({event['event_type']}): {event['reason']}")
            continue
        missing = " (no id sent: keyless)" if event["key_missing"] else ""
        click.echo(
            f"  #{n} {event['event_id']}{missing}  type {event['event_type']}  "
            f"record {event['record_key']}  shard {event['shard']}"
        )
        for field, change in event["changes"].items():
            click.echo(f"      {field}: {change['op']} {change.get('value')!r}")
        if event["conditions"]:
            click.echo(f"      conditions: {event['conditions']}")
        if event["identities"]:
            click.echo(f"      also: {', '.join(event['identities'])}")


@sources.command("show-secret")
@click.argument("source_name", metavar="SOURCE")
@click.pass_context
def show_secret(ctx: click.Context, source_name: str) -> None:
    """Print the secret SOURCE's sender handed over in its handshake: Notion's
    verification_token, which its "Verify" asks for (or Asana's X-Hook-Secret). Exit code
    1 when none is kept."""
    settings = settings_of(ctx)
    if load_sources(settings).get(source_name) is None:
        raise ConfigError(f"no source named {source_name!r}")
    kept = asyncio.run(kept_secret(settings, source_name))
    if kept is None:
        click.echo(f"{source_name}: no secret is kept (its handshake has not come)", err=True)
        raise SystemExit(1)
    click.echo(kept)


async def kept_secret(settings: Settings, source: str) -> str | None:
    """The secret ``source``'s sender handed over in its handshake, if one is kept."""
    gateway = ReceiverGateway.from_settings(settings)
    try:
        return await gateway.kept_secret(source)
    finally:
        await gateway.close()


@sources.command("forget-secret")
@click.argument("source_name", metavar="SOURCE")
@click.pass_context
def forget_secret(ctx: click.Context, source_name: str) -> None:
    """Forget the secret SOURCE's sender handed over in its handshake (Asana's
    X-Hook-Secret, Notion's verification_token), so that a new webhook's handshake can
    hand over its own. Until then, SOURCE's deliveries fail their check (401)."""
    settings = settings_of(ctx)
    if load_sources(settings).get(source_name) is None:
        raise ConfigError(f"no source named {source_name!r}")
    forgot = asyncio.run(_forget(settings, source_name))
    click.echo(f"{source_name}: {'secret forgotten' if forgot else 'no secret was kept'}")


async def _forget(settings: Settings, source: str) -> bool:
    gateway = ReceiverGateway.from_settings(settings)
    try:
        return await gateway.forget_secret(source)
    finally:
        await gateway.close()

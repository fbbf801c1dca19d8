"""``keylane send SOURCE --file body.json``: a test delivery to a running receiver, as
SOURCE's sender would send it (:mod:`keylane.ops.send`)."""

from __future__ import annotations

from pathlib import Path

import click
import httpx

from ..routing.contract.errors import ConfigError
from .cli_common import settings_of
from .send import build_request, media_type_of, source_named


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise click.BadParameter(f"expected 'Name: value', got {text!r}", param_hint="--header")
    return name.strip(), value.strip()


@click.command("send")
@click.argument("source_name", metavar="SOURCE")
@click.option(
    "--file",
    "body_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="The body to send, as it is (the provider's payload).",
)
@click.option(
    "--content-type",
    default=None,
    help="The body's media type (default: by the file's extension: .json, .xml, .form).",
)
@click.option(
    "--header",
    "headers",
    multiple=True,
    metavar="'NAME: VALUE'",
    help="A header to send besides the signature's (repeatable; e.g. X-GitHub-Event: push).",
)
@click.option(
    "--event-id",
    default=None,
    help="The event id, for a source that reads it from a header (GitHub's "
    "X-GitHub-Delivery, webhook-id, header:<name>); default: a new one on each send. An id "
    "in the body is the file's.",
)
@click.option(
    "--url",
    default=None,
    help="Where to send it (default: this deployment's receiver, "
    "http://127.0.0.1:PORT/webhooks/SOURCE).",
)
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds.")
@click.pass_context
def send(
    ctx: click.Context,
    source_name: str,
    body_file: Path,
    content_type: str | None,
    headers: tuple[str, ...],
    event_id: str | None,
    url: str | None,
    timeout: float,
) -> None:
    """Send the body in --file to the receiver as SOURCE's sender would: signed with the
    source's own secret (its secrets_env, the first one; or the secret its sender handed
    over in a handshake), the event id in the header its scheme carries it in, to the
    URL the signature names where the scheme signs one (KEYLANE_PUBLIC_URL). Prints the
    answer's status and body.

    Exit code 0 for a 2xx answer, 1 for any other, 2 when nothing was sent (no such
    source, a secret not set, the receiver not reached).
    """
    settings = settings_of(ctx)
    source = source_named(settings, source_name)
    request = build_request(
        settings,
        source,
        body_file.read_bytes(),
        content_type or media_type_of(body_file),
        url,
        dict(_header(h) for h in headers),
        event_id,
    )
    try:
        answer = httpx.post(
            request.url, content=request.body, headers=request.headers, timeout=timeout
        )
    except httpx.HTTPError as exc:
        where = request.url.split("?", 1)[0]  # (a token may ride in the query)
        raise ConfigError(
            f"could not send to {where}: {type(exc).__name__} (is the receiver running? keylane up)"
        ) from None
    if request.event_id is not None:
        click.echo(f"event id {request.event_id}", err=True)
    click.echo(f"{answer.status_code} {answer.reason_phrase}")
    if answer.content:
        click.echo(answer.text)
    raise SystemExit(0 if 200 <= answer.status_code < 300 else 1)

"""A delivery read as its source says, short of accepting it: verified over the bytes as
they came, its body read into one tree, a signed handshake answered, its events taken
out. The receiver runs it on every ``POST``; ``keylane sources try`` runs it on a captured
request, to show what keylane would do with it."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

from ..routing.contract.errors import ConfigError
from ..routing.contract.settings import Settings
from ..routing.contract.sources import Hook, SourceConfig
from ..routing.hot_records import hot_record
from .answers import Answer
from .formats import read_tree
from .handshakes import Handshakes
from .intake import Ignored, Intake, Parts, take_in_all
from .signatures import NO_TARGET, Target, Verified, Verifier


@hot_record
class Taken:
    """What a delivery became: what its check vouched for, and its events (one, or one
    per item of a batched delivery; each an event or ignored)."""

    verified: Verified
    events: list[Intake | Ignored]


def read_verified(
    source: SourceConfig,
    verifier: Verifier,
    handshakes: Handshakes,
    parts: Parts,
    target: Target,
    now: float,
    hook: Hook | None,
    max_items: int,
) -> Answer | Taken:
    """The delivery in ``parts`` checked by ``verifier`` (``SignatureError`` if not),
    read (``InvalidEvent`` if it cannot be), and either a handshake's answer or what it
    became (:class:`Taken`)."""
    verified = verifier.verify(parts.headers, parts.body, now, target)
    content_type = parts.headers.get("content-type", "")
    tree = read_tree(parts.body, content_type, parts.form, source.json_field_paths)
    if source.handshake is not None:
        answer = handshakes.after_verify(source, tree)
        if answer is not None:
            return answer
    return Taken(verified, take_in_all(source, verified, parts, tree, hook, max_items))


def query_params(query: bytes) -> dict[str, str]:
    """A request's query parameters, the first value of each."""
    if not query:
        return {}
    params: dict[str, str] = {}
    for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        params.setdefault(name, value)
    return params


def target_of(
    source: SourceConfig, settings: Settings, path: str, query: bytes, params: dict[str, str]
) -> Target:
    """The request line as the sender sent it, for schemes that read more than the body:
    its query parameters, and the URL it called (the configured public one, never the
    ``Host`` header, which anyone chooses) for schemes that sign it."""
    if not params and not source.signs_url:
        return NO_TARGET
    return Target("POST", public_url(source, settings, path, query), params)


def public_url(source: SourceConfig, settings: Settings, path: str, query: bytes) -> str:
    """The URL a sender called: the source's ``public_url`` (its whole URL), else
    ``KEYLANE_PUBLIC_URL`` and the request's path, with the query as sent; ``""`` when
    neither is configured."""
    if source.public_url is not None:
        base = urlsplit(source.public_url)._replace(query="", fragment="").geturl()
    elif settings.public_url is not None:
        base = settings.public_url.rstrip("/") + path
    else:
        return ""
    return f"{base}?{query.decode('latin-1')}" if query else base


def check_public_url(source: SourceConfig, settings: Settings) -> None:
    """``ConfigError`` at start-up for a source whose sender signs the URL it calls when no
    public URL is configured (every delivery would fail its check)."""
    if source.signs_url and source.public_url is None and settings.public_url is None:
        raise ConfigError(
            f"source {source.name}: its sender signs the URL it calls; set KEYLANE_PUBLIC_URL "
            "(the URL senders reach the receiver at, e.g. https://hooks.example.com) or the "
            "source's public_url"
        )

"""``keylane send``: a test delivery to a running receiver, made as a source's sender makes
it (signed with the source's own secret, its event id where the scheme carries one), to
try a mapping end to end without the provider. See ``ops/docs/senders.md``."""

from __future__ import annotations

import asyncio
import mimetypes
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ..producers.delivery import public_url
from ..producers.rerun import id_header
from ..producers.signatures.signer import Outgoing, sign
from ..routing.contract.errors import ConfigError
from ..routing.contract.settings import Settings
from ..routing.contract.signing import NoneConfig, load_secrets
from ..routing.contract.sources import SourceConfig, load_sources
from .cli_sources import kept_secret

#: Media types by file extension, where Python's table has none or another.
_MEDIA_TYPES = {
    ".json": "application/json",
    ".xml": "application/xml",
    ".form": "application/x-www-form-urlencoded",
    ".urlencoded": "application/x-www-form-urlencoded",
}


@dataclass(frozen=True)
class Request:
    """The delivery to send: where, its headers (signed) and body, and its event id when
    this command chose it (a header the scheme carries it in)."""

    url: str
    headers: dict[str, str]
    body: bytes
    event_id: str | None


def source_named(settings: Settings, name: str) -> SourceConfig:
    """The source ``name``; ``ConfigError`` naming the sources there are when none is."""
    sources = load_sources(settings)
    source = sources.get(name)
    if source is None:
        raise ConfigError(f"no source named {name!r} (sources: {', '.join(sources.names())})")
    return source


def media_type_of(path: Path) -> str:
    """The media type a file's extension says (JSON, XML, a form; else Python's table,
    else bytes)."""
    suffix = path.suffix.lower()
    known = _MEDIA_TYPES.get(suffix) or mimetypes.guess_type(path.name)[0]
    return known or "application/octet-stream"


def local_url(settings: Settings, source: str) -> str:
    """The receiver of this deployment, as this machine reaches it."""
    host = settings.host if settings.host not in ("", "0.0.0.0", "::") else "127.0.0.1"  # noqa: S104
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.port}/webhooks/{source}"


def build_request(
    settings: Settings,
    source: SourceConfig,
    body: bytes,
    content_type: str,
    url: str | None,
    extra_headers: Mapping[str, str],
    event_id: str | None,
    environ: Mapping[str, str] = os.environ,
) -> Request:
    """The delivery ``source``'s sender would send with ``body``: its event id header set
    (``event_id``, else a new one: each send is a new event, as each of the provider's
    is), signed with the source's first secret (or the one its sender handed over in a
    handshake), to ``url`` (default: the local receiver)."""
    parts = urlsplit(url or local_url(settings, source.name))
    headers = {"content-type": content_type, **extra_headers}
    header = id_header(source)
    if header is None and event_id is not None:
        raise ConfigError(
            f"source {source.name} reads its event id from {source.event_id_rule}, not a "
            "header: change it in the file"
        )
    if header is not None:
        event_id = event_id or f"send_{uuid.uuid4().hex[:16]}"
        headers[header] = event_id
    called = public_url(source, settings, parts.path, b"")
    out = Outgoing(body, headers, parts.query, called)
    signature = sign(source.verify, _secret(settings, source, environ), out, time.time())
    target = urlunsplit((parts.scheme, parts.netloc, parts.path, signature.query, ""))
    return Request(target, {**headers, **signature.headers}, body, event_id)


def _secret(settings: Settings, source: SourceConfig, environ: Mapping[str, str]) -> str | None:
    config = source.verify
    if isinstance(config, NoneConfig):
        return None
    secrets = load_secrets(config, environ)
    if secrets:
        return secrets[0].get_secret_value()
    preset = source.preset
    if preset is None or preset.check != "hmac":
        return None  # a check of what the body carries (Salesforce, Graph)
    kept = asyncio.run(kept_secret(settings, source.name))
    if kept is None:
        raise ConfigError(
            f"source {source.name}: no secret is kept yet (its sender hands it over in its "
            "handshake, which comes first)"
        )
    return kept

"""Sentry for every keylane process.

``SENTRY_DSN`` turns on the Starlette (ASGI) integration in the receiver, the Celery
integration in workers, and plain capture in ``keylane up``, which reports a child that
died. Nothing a sender sent leaves the process: request bodies are never attached, no
local variables are captured, request headers (signatures), cookies and query strings are
dropped, and every configured secret is replaced wherever it appears. Events about one
webhook carry its source, event id, record key and shard as tags
(:func:`keylane.routing.contract.logcontext.event_context`, added here as the event is sent).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import sentry_sdk
from sentry_sdk.integrations.logging import LoggingIntegration
from sentry_sdk.integrations.redis import RedisIntegration

from ..routing.contract.logcontext import current_event
from ..routing.contract.settings import Settings

FILTERED = "[Filtered]"


def init_sentry(
    settings: Settings, component: str, environ: Mapping[str, str] | None = None
) -> bool:
    """Turn Sentry on when a DSN is configured; False when it is not."""
    if settings.sentry_dsn is None:
        return False
    environ = os.environ if environ is None else environ
    secrets = _secrets(settings, environ)
    integrations: list[Any] = [LoggingIntegration(level=logging.INFO, event_level=None)]
    if component == "receiver":
        from sentry_sdk.integrations.starlette import StarletteIntegration

        integrations.append(StarletteIntegration())
    if component == "worker":
        from sentry_sdk.integrations.celery import CeleryIntegration

        integrations.append(CeleryIntegration())
    sentry_sdk.init(
        dsn=settings.sentry_dsn.get_secret_value(),
        integrations=integrations,
        send_default_pii=False,
        max_request_body_size="never",
        include_local_variables=False,
        traces_sample_rate=0.0,
        server_name=None,
        before_send=lambda event, hint: scrub(with_event_tags(event), secrets),
        before_breadcrumb=lambda crumb, hint: scrub(crumb, secrets),
        # Every take and ack is a Redis call: as breadcrumbs they would bury the few
        # that explain an error.
        disabled_integrations=[RedisIntegration()],
        max_breadcrumbs=30,
    )
    sentry_sdk.set_tag("keylane.component", component)
    return True


def with_event_tags(event: Any) -> Any:
    """Tag a Sentry event captured while a webhook event was handled with that event's
    fields (``keylane.source``, ``keylane.event_id``, ...); tags already set win."""
    fields = current_event()
    fields.pop("attempt", None)
    if fields and isinstance(event, dict):
        tags = event.setdefault("tags", {})
        for name, value in fields.items():
            tags.setdefault(f"keylane.{name}", str(value))
    return event


def _secrets(settings: Settings, environ: Mapping[str, str]) -> list[str]:
    """Every secret value this process knows of: the signing secrets its sources name,
    and the credentials in its URLs."""
    values: list[str] = []
    with contextlib.suppress(Exception):
        from ..routing.contract.sources import load_sources

        for source in load_sources(settings).all():
            for name in getattr(source.verify, "secrets_env", ()):
                if environ.get(name):
                    values.append(environ[name])
    for secret in (settings.redis_url, settings.store_url, settings.flower_basic_auth):
        if secret is not None:
            values.append(secret.get_secret_value())
    for url in (settings.redis_url, settings.store_url):
        if url is not None:
            values.extend(_url_password(url.get_secret_value()))
    # Longest first: a whole URL is replaced before the password inside it.
    return sorted({v for v in values if len(v) >= 4}, key=len, reverse=True)


def _url_password(url: str) -> list[str]:
    """The password in ``url`` as written and decoded: drivers' errors may quote it alone."""
    with contextlib.suppress(ValueError):
        password = urlsplit(url).password
        if password:
            return [password, unquote(password)]
    return []


def scrub(event: Any, secrets: list[str]) -> Any:
    """Drop what a sender sent (bodies, headers, cookies, query strings) and replace every
    known secret, anywhere in the event."""
    if isinstance(event, dict):
        request = event.get("request")
        if isinstance(request, dict):
            for key in ("data", "headers", "cookies", "query_string", "env"):
                request.pop(key, None)
    return _replace_secrets(event, secrets)


def _replace_secrets(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, FILTERED)
        return value
    if isinstance(value, dict):
        return {k: _replace_secrets(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_secrets(v, secrets) for v in value]
    return value

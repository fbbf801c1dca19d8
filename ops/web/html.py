"""HTML built so that nothing is left unescaped: :func:`tag` escapes every child and every
attribute value that is not already :class:`Html` (markup built here), so a field value,
a header, a body or an error message shows as text, whatever it holds. No templates, no
script: each page is a few calls of these, laid out by :func:`page`."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from starlette.responses import HTMLResponse


class Html(str):
    """Markup built by :func:`tag` (or escaped by :func:`esc`): inserted as it is."""

    __slots__ = ()


Child = Any  # Html, text (escaped), a number, None (nothing), or an iterable of them


def esc(value: Child) -> Html:
    """``value`` as markup: Html as it is, None as nothing, an iterable joined, anything
    else as escaped text."""
    if isinstance(value, Html):
        return value
    if value is None:
        return Html("")
    if isinstance(value, list | tuple) or (
        isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping)
    ):
        return Html("".join(esc(v) for v in value))
    return Html(html.escape(str(value), quote=True))


def tag(element: str, /, *children: Child, **attrs: str | int | bool | None) -> Html:
    """``<element attrs>children</element>``; ``class_`` is ``class``; an attribute that is None
    or False is left out, True stands alone. Void elements (``input``, ``meta``, ``link``,
    ``br``) have no children."""
    parts = [element]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        attr = key.rstrip("_").replace("_", "-")
        parts.append(attr if value is True else f'{attr}="{esc(value)}"')
    opening = f"<{' '.join(parts)}>"
    if element in ("input", "meta", "link", "br"):
        return Html(opening)
    return Html(f"{opening}{esc(children)}</{element}>")


def link(href: str, *children: Child, **attrs: str | None) -> Html:
    """An ``<a>``."""
    return tag("a", *children, href=href, **attrs)


def url(path: str, **query: str | int | None) -> str:
    """``path`` with the query parameters that have a value (a filter's shareable URL)."""
    params = {k: v for k, v in query.items() if v not in (None, "")}
    return f"{path}?{urlencode(params)}" if params else path


def utc(ts: float | None) -> Html:
    """A time, in UTC, in a ``<time>`` element."""
    if ts is None:
        return Html("-")
    at = datetime.fromtimestamp(ts, UTC)
    return tag("time", at.strftime("%Y-%m-%d %H:%M:%S") + " UTC", datetime=at.isoformat())


def as_json(value: Any) -> str:
    """A value as JSON text (for fields, changes, payloads)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def table(headers: list[str], rows: Iterable[list[Child]], empty: str) -> Html:
    """A table (scrolling sideways on a narrow screen), or ``empty`` when there are no rows."""
    body = [tag("tr", [tag("td", cell) for cell in row]) for row in rows]
    if not body:
        return tag("p", empty, class_="empty")
    head = tag("thead", tag("tr", [tag("th", h, scope="col") for h in headers]))
    return tag("div", tag("table", head, tag("tbody", body)), class_="wide")


def facts(pairs: Iterable[tuple[str, Child]]) -> Html:
    """A definition list: name, value."""
    return tag("dl", [[tag("dt", name), tag("dd", value)] for name, value in pairs])


def page(title: str, *body: Child, status_code: int = 200, notice: Child = None) -> HTMLResponse:
    """The whole page: the head, the navigation, a notice (what an action did), ``body``."""
    nav = tag(
        "nav",
        link("/", "keylane", class_="home"),
        link("/deliveries", "Deliveries"),
        link("/dead-letters", "Dead letters"),
        link("/records", "Records"),
    )
    document = Html("<!doctype html>") + tag(
        "html",
        tag(
            "head",
            tag("meta", charset="utf-8"),
            tag("meta", name="viewport", content="width=device-width, initial-scale=1"),
            tag("title", f"{title} · keylane"),
            tag("link", rel="stylesheet", href="/web.css"),
        ),
        tag(
            "body",
            tag("header", nav),
            tag(
                "main",
                tag("p", notice, class_="notice", role="status") if notice else None,
                tag("h1", title),
                body,
            ),
        ),
        lang="en",
    )
    return HTMLResponse(document, status_code=status_code, headers=PAGE_HEADERS)


#: No script runs, nothing is fetched from elsewhere, no other site may frame a page.
PAGE_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

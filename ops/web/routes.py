"""The web view's routes, mounted on the operations listener beside ``/metrics``
(``operations_app(receiver, extra=web_routes(settings))``), never on the webhook port.

Every page is a GET that changes nothing; its reads (Redis, the store) are blocking
calls, run in a thread so that the listener's event loop (which also serves
``/metrics``) never waits on them. The two actions, retry and resolve a dead letter, are
POSTs behind :class:`~keylane.ops.web.guard.Guard`, and answer with the row's page
saying what they did."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from importlib import resources

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...routing.contract.errors import BrokerUnavailable, KeylaneError, StoreError
from ...routing.contract.settings import Settings
from ..dead_letter_work import dead_letter_stats
from .dead_letter_pages import (
    dead_letter_page,
    dead_letters_list,
    resolve_row,
    retry_row,
    what_was_done,
)
from .delivery_pages import deliveries_list, delivery_page
from .guard import TOKEN_FIELD, Guard
from .html import facts, link, page, tag, url
from .reading import Params, Shown
from .record_pages import record_page, records_list

log = logging.getLogger("keylane.web")

CSS = resources.files(__package__).joinpath("web.css").read_text()

Reader = Callable[[Settings, Params], Shown]


def web_routes(settings: Settings) -> list[BaseRoute]:
    """The view's routes over ``settings``' deployment (none when ``KEYLANE_WEB_VIEW`` is
    off)."""
    if not settings.web_view:
        return []
    guard = Guard(settings.ops_host)

    def reading(reader: Reader) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return await _answer(
                guard, request, lambda: reader(settings, Params(request.query_params))
            )

        return endpoint

    async def row(request: Request) -> Response:
        row_id = request.path_params["row_id"]
        return await _answer(
            guard, request, lambda: dead_letter_page(settings, row_id, guard.token)
        )

    def acting(verb: str) -> Callable[[Request], Awaitable[Response]]:
        act = retry_row if verb == "retry" else resolve_row

        async def endpoint(request: Request) -> Response:
            row_id: int = request.path_params["row_id"]
            form = await request.form()
            token, note = str(form.get(TOKEN_FIELD, "")), str(form.get("note", "")).strip()
            refusal = guard.action_refusal(request, token)
            if refusal is not None:
                log.warning("web view: refused a %s of dead letter %s: %s", verb, row_id, refusal)
                return page("Refused", tag("p", refusal), status_code=403)

            def run() -> Shown:
                done = what_was_done(verb, act(settings, row_id, note))
                return dead_letter_page(settings, row_id, guard.token, done)

            return await _answer(guard, request, run)

        return endpoint

    async def home(request: Request) -> Response:
        return await _answer(guard, request, lambda: _home(settings))

    return [
        Route("/", home, methods=["GET"]),
        Route("/web.css", _css, methods=["GET"]),
        Route("/deliveries", reading(deliveries_list), methods=["GET"]),
        Route("/delivery", reading(delivery_page), methods=["GET"]),
        Route("/dead-letters", reading(dead_letters_list), methods=["GET"]),
        Route("/dead-letters/{row_id:int}", row, methods=["GET"]),
        Route("/dead-letters/{row_id:int}/retry", acting("retry"), methods=["POST"]),
        Route("/dead-letters/{row_id:int}/resolve", acting("resolve"), methods=["POST"]),
        Route("/records", reading(records_list), methods=["GET"]),
        Route("/record", reading(record_page), methods=["GET"]),
    ]


async def _answer(guard: Guard, request: Request, read: Callable[[], Shown]) -> Response:
    """The page ``read`` makes (in a thread), or one that says why there is none."""
    refusal = guard.host_refusal(request)
    if refusal is not None:
        return page("Not this host", tag("p", refusal), status_code=421)
    try:
        shown = await run_in_threadpool(read)
    except (StoreError, BrokerUnavailable) as exc:
        return page("Cannot read", tag("p", str(exc)), status_code=503)
    except KeylaneError as exc:  # what was asked for: a bad filter, a row that is not there
        missing = str(exc).startswith("no ")
        return page(
            "Not found" if missing else "Cannot show that",
            tag("p", str(exc)),
            status_code=404 if missing else 400,
        )
    except Exception as exc:  # Redis or the store down: say so, as /metrics does
        log.exception("web view: cannot read %s", request.url.path)
        return page("Cannot read", tag("p", f"cannot read: {exc}"), status_code=503)
    return page(shown.title, *shown.body, status_code=shown.status_code, notice=shown.notice)


async def _css(request: Request) -> Response:
    return Response(CSS, media_type="text/css", headers={"cache-control": "max-age=300"})


def _home(settings: Settings) -> Shown:
    stats = dead_letter_stats(settings)
    open_rows = stats["by_status"].get("open", 0)
    by_reason = [
        (reason, link(url("/dead-letters", reason=reason), f"{n} open"))
        for reason, n in sorted(stats["open_by_reason"].items())
    ]
    return Shown(
        "keylane",
        [
            tag(
                "ul",
                tag(
                    "li",
                    link("/deliveries", "Deliveries turned away"),
                    ": what the receiver refused, and what it kept of each request.",
                ),
                tag(
                    "li",
                    link("/dead-letters", "Dead letters"),
                    f": {open_rows} open. Retry one, or resolve it.",
                ),
                tag("li", link("/records", "Records"), ": by key prefix, each whole."),
                class_="guide",
            ),
            facts(by_reason) if by_reason else None,
            tag("p", "Metrics for a scraper: ", link("/metrics", "/metrics"), class_="hint"),
        ],
    )

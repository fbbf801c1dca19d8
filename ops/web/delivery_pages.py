"""The deliveries' pages: the list (filters and paging in the URL) and one delivery, read
through ``ops/deliveries.py`` as ``keylane deliveries`` reads them."""

from __future__ import annotations

from typing import Any

from ...routing.contract.errors import KeylaneError
from ...routing.contract.settings import Settings
from ...routing.contract.sources import load_sources
from ..cli_common import parse_age
from ..deliveries import (
    OUTCOMES,
    STATUSES,
    DeliveryQuery,
    body_kept,
    list_deliveries,
    show_delivery,
)
from .html import Child, Html, facts, link, table, tag, url, utc
from .reading import Params, Shown, filter_form, select, text_input

#: Rows a page unless ``limit`` says otherwise.
PER_PAGE = 20


def deliveries_list(settings: Settings, params: Params) -> Shown:
    """``/deliveries?source=&status=&outcome=&since=&limit=&before=``: newest first."""
    source, status, since = params.one("source"), params.one("status"), params.one("since")
    outcome = params.one("outcome")
    limit = params.limit(PER_PAGE)
    query = DeliveryQuery(
        (source,) if source else (),
        (status,) if status else (),
        parse_age(since) if since else None,
        limit,
        params.one("before") or None,
        (outcome,) if outcome else (),
    )
    found = list_deliveries(settings, query)
    form = filter_form(
        "/deliveries",
        select("source", "Source", load_sources(settings).names(), source),
        select("status", "Status", STATUSES, status),
        select("outcome", "Events' outcome", OUTCOMES, outcome),
        text_input("since", "Newer than", since, "15m, 2h, 3d"),
    )
    rows = [
        [
            link(url("/delivery", id=e["id"]), e["id"]),
            utc(e["at_ms"] / 1000),
            link(url("/deliveries", source=e["source"]), e["source"]),
            _status(e),
            tag("code", e["code"]),
            e["detail"],
        ]
        for e in found.entries
    ]
    more = None
    if found.next_before is not None:
        following = url(
            "/deliveries",
            source=source,
            status=status,
            outcome=outcome,
            since=since,
            limit=limit if limit != PER_PAGE else None,
            before=found.next_before,
        )
        more = tag("p", link(following, "Older deliveries →", rel="next"), class_="paging")
    return Shown(
        "Deliveries",
        [
            tag(
                "p",
                "The deliveries kept: those turned away or ignored, and those accepted that "
                "their source's window keeps, with what the receiver answered and what it "
                "kept of the request (secrets redacted), newest first. Times are UTC.",
                class_="lead",
            ),
            form,
            table(
                ["delivery", "at", "source", "status", "code", "detail"],
                rows,
                "No delivery kept" + (" matches these filters." if params.any() else "."),
            ),
            more,
        ],
    )


def delivery_page(settings: Settings, params: Params) -> Shown:
    """``/delivery?id=SOURCE/STREAM-ID``: the request, the answer, the body kept."""
    delivery_id = params.one("id")
    if not delivery_id:
        raise KeylaneError("which delivery? /delivery?id=SOURCE/STREAM-ID, as listed")
    e = show_delivery(settings, delivery_id)
    query = f"?{e['query']}" if e["query"] else ""
    about = facts(
        [
            ("Source", link(url("/deliveries", source=e["source"]), e["source"])),
            ("At", utc(e["at_ms"] / 1000)),
            ("Answered", [_status(e), " ", tag("code", e["code"]), " ", e["detail"]]),
            ("Request", tag("code", f"{e['method']} {e['path']}{query}")),
            ("Verified", "yes" if e["verified"] else "no"),
            ("Body", f"{e['size']} bytes, {body_kept(e)}"),
            ("SHA-256", tag("code", e["sha256"] or "-")),
        ]
    )
    headers = table(
        ["header", "value"],
        [[tag("code", name), value] for name, value in e["headers"].items()],
        "No headers kept.",
    )
    return Shown(
        f"Delivery {delivery_id}",
        [
            about,
            *_events(e),
            tag("h2", "Headers"),
            headers,
            tag("h2", "Body kept"),
            _body(e),
            tag(
                "p",
                "The same, from a shell: ",
                tag("code", f"keylane deliveries show {delivery_id} --body"),
                class_="hint",
            ),
        ],
    )


def _events(e: dict[str, Any]) -> list[Child]:
    """An accepted delivery's events, each with its outcome, its record and its dead
    letters (a door entry has none)."""
    if not e["events"]:
        return []
    rows = [
        [
            tag("code", event["event_id"]),
            link(url("/record", key=event["record_key"]), event["record_key"]),
            tag("span", event["outcome"], class_=f"badge {event['outcome']}"),
            event["revision"],
            [
                [link(f"/dead-letters/{row['id']}", f"#{row['id']} {row['reason']}"), " "]
                for row in event.get("dead_letters", [])
            ],
        ]
        for event in e["events"]
    ]
    return [
        tag("h2", "Events"),
        table(["event", "record", "outcome", "revision", "dead letters"], rows, "No events."),
    ]


def _status(e: dict[str, Any]) -> Html:
    return tag("span", f"{e['status']} {e['status_name']}", class_=f"badge {e['status_name']}")


def _body(e: dict[str, Any]) -> Child:
    body: bytes | None = e["body"]
    if body is None:
        return tag("p", body_kept(e), class_="empty")
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return tag("p", f"{len(body)} bytes, not UTF-8 text: see --body", class_="empty")
    cut = f" (the first {e['body_kept']} of {e['size']} bytes)" if e["body_cut"] else ""
    return [tag("pre", text), tag("p", cut, class_="hint") if cut else None]

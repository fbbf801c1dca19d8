"""The records' pages: the list by key prefix and fields (paging in the URL) and one
record, read through ``ops/records_read.py`` as ``keylane records list / get`` read them."""

from __future__ import annotations

from ...routing.contract.errors import KeylaneError
from ...routing.contract.settings import Settings
from ...workers.store_rows import RecordQuery
from ..outside_edit import parse_assignment
from ..records_read import get_record, list_records
from .dead_letter_pages import record_link
from .html import Child, as_json, facts, link, table, tag, url, utc
from .reading import Params, Shown, filter_form, text_input

#: Rows a page unless ``limit`` says otherwise.
PER_PAGE = 50
#: The most of a record's fields the list shows (its page shows them whole).
FIELDS_SHOWN_CHARS = 160


def records_list(settings: Settings, params: Params) -> Shown:
    """``/records?prefix=&where=FIELD=VALUE&limit=&after=``: in key order."""
    prefix, where, after = params.one("prefix"), params.all("where"), params.one("after")
    limit = params.limit(PER_PAGE)
    query = RecordQuery(
        prefix=prefix,
        where=tuple(parse_assignment(w) for w in where),
        after=after,
        limit=limit,
    )
    page = list_records(settings, query)
    form = filter_form(
        "/records",
        text_input("prefix", "Key starts with", prefix, "contact:"),
        text_input("where", "Field equals", where[0] if where else "", "plan=pro"),
    )
    rows = [
        [record_link(r.key), r.revision, utc(r.updated_at), tag("code", _cut(as_json(r.fields)))]
        for r in page.records
    ]
    more = None
    if page.next_after is not None:
        nxt = url(
            "/records",
            prefix=prefix,
            where=where[0] if len(where) == 1 else None,
            limit=limit if limit != PER_PAGE else None,
            after=page.next_after,
        )
        more = tag("p", link(nxt, "More records →", rel="next"), class_="paging")
    return Shown(
        "Records",
        [
            tag(
                "p",
                "keylane's own records, in key order: each with its revision and when it "
                "was last written (UTC).",
                class_="lead",
            ),
            form,
            table(
                ["key", "revision", "updated", "fields"],
                rows,
                "No record" + (" matches these filters." if params.any() else " yet."),
            ),
            more,
        ],
    )


def record_page(settings: Settings, params: Params) -> Shown:
    """``/record?key=KEY``: its fields whole, its identities, its dead letters."""
    key = params.one("key")
    if not key:
        raise KeylaneError("which record? /record?key=KEY")
    shown = get_record(settings, key)
    record = shown.record
    if not record.exists:
        return Shown(f"Record {key}", [tag("p", "No such record.", class_="empty")], 404)
    pairs: list[tuple[str, Child]] = [
        ("Revision", record.revision),
        ("Created", utc(record.created_at)),
        ("Updated", utc(record.updated_at)),
    ]
    if record.merged_into is not None:
        merged = ["merged into ", record_link(record.merged_into), ": its events go there"]
        pairs.append(("Merged", merged))
    if shown.identities:
        pairs.append(("Identities", ", ".join(shown.identities)))
    dead = url("/dead-letters", key=key, status="any")
    pairs.append(("Dead letters", link(dead, "about this record")))
    fields = table(
        ["field", "value"],
        [
            [tag("code", name), tag("code", as_json(record.fields[name]))]
            for name in sorted(record.fields)
        ],
        "No fields.",
    )
    return Shown(f"Record {key}", [facts(pairs), tag("h2", "Fields"), fields])


def _cut(text: str) -> str:
    return text if len(text) <= FIELDS_SHOWN_CHARS else text[: FIELDS_SHOWN_CHARS - 1] + "…"

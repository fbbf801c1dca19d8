"""The dead letters' pages: the list (filters and paging in the URL), one row with its
record as it is now, and the two actions, retry and resolve, read and done through
``ops/dead_letter_work.py`` as ``keylane dlq`` does them."""

from __future__ import annotations

from ...routing.contract.errors import KeylaneError
from ...routing.contract.settings import Settings
from ...routing.contract.sources import load_sources
from ...workers.store_rows import DEAD_LETTER_STATUSES, MERGE_REVIEW, DeadLetter, DeadLetterFilter
from ..cli_common import operator, parse_age
from ..dead_letter_work import (
    DeadLetterShown,
    act_on_one,
    list_dead_letters,
    resolve,
    retry,
    show_dead_letter,
)
from ..merge_review import MergeSides, merge_lines
from ..triage import NOT_RETRYABLE, Handled, kind_of
from .html import Child, Html, as_json, facts, link, table, tag, url, utc
from .reading import Params, Shown, filter_form, select, text_input

#: Rows a page unless ``limit`` says otherwise.
PER_PAGE = 50
#: ``status=any``: rows in every status (the list shows the open ones unless told).
ANY = "any"


def dead_letters_list(settings: Settings, params: Params) -> Shown:
    """``/dead-letters?status=&reason=&source=&key=&older_than=&limit=&after=``: oldest
    first, the open rows unless ``status`` says otherwise."""
    status = params.one("status") or "open"
    if status != ANY and status not in DEAD_LETTER_STATUSES:
        raise KeylaneError(f"status={status}: one of {', '.join(DEAD_LETTER_STATUSES)} or any")
    reason, source, key = params.one("reason"), params.one("source"), params.one("key")
    older = params.one("older_than")
    after = params.one("after")
    if after and not after.isdigit():
        raise KeylaneError(f"after={after}: a dead letter's id")
    limit = params.limit(PER_PAGE)
    selection = DeadLetterFilter(
        statuses=() if status == ANY else (status,),
        reasons=(reason,) if reason else (),
        sources=(source,) if source else (),
        record_key=key or None,
        older_than_s=parse_age(older) if older else None,
        limit=limit + 1,  # one past the page: is there a next one
        after_id=int(after) if after else None,
    )
    rows = list_dead_letters(settings, selection)
    page, more = rows[:limit], len(rows) > limit
    form = filter_form(
        "/dead-letters",
        select("status", "Status", [*DEAD_LETTER_STATUSES, ANY], status, blank=False),
        text_input("reason", "Reason", reason, "conflict, type, not_owned"),
        select("source", "Source", load_sources(settings).names(), source),
        text_input("key", "Record key", key, "contact:42"),
        text_input("older_than", "Older than", older, "15m, 2h, 3d"),
    )
    table_rows = [
        [
            link(f"/dead-letters/{r.id}", r.id),
            utc(r.created_at),
            _status(r.status),
            r.reason,
            r.source,
            r.event_id,
            record_link(r.record_key),
            r.revision_read,
            r.revision_found,
            r.attempts,
        ]
        for r in page
    ]
    following = None
    if more:
        nxt = url(
            "/dead-letters",
            status=status if status != "open" else None,
            reason=reason,
            source=source,
            key=key,
            older_than=older,
            limit=limit if limit != PER_PAGE else None,
            after=page[-1].id,
        )
        following = tag("p", link(nxt, "Newer rows →", rel="next"), class_="paging")
    headers = ["id", "created", "status", "reason", "source", "event", "record", "read"]
    return Shown(
        "Dead letters",
        [
            tag(
                "p",
                "Events that could not be applied, each a review row: why, and what a person "
                "needs to decide. Oldest first. Times are UTC.",
                class_="lead",
            ),
            form,
            table(
                [*headers, "found", "tries"],
                table_rows,
                f"No {'' if status == ANY else status + ' '}dead letter"
                + (" matches these filters." if params.any() else "."),
            ),
            following,
        ],
    )


def dead_letter_page(settings: Settings, row_id: int, token: str, done: Child = None) -> Shown:
    """``/dead-letters/ID``: the row, its record now, the diff, and what can be done."""
    shown = show_dead_letter(settings, row_id)
    row = shown.row
    body: list[Child] = [_about(shown), _actions(row, token)]
    if row.error:
        body += [tag("h2", "Error"), tag("pre", row.error)]
    if kind_of(row) == "delivery":
        body += [tag("h2", "Payload"), tag("pre", as_json(row.event.get("payload")))]
    elif row.reason == MERGE_REVIEW:
        body += [
            tag("h2", "The two records"),
            tag("pre", "\n".join(merge_lines(MergeSides.of(row)))),
        ]
    else:
        body += [tag("h2", "The change, beside the record now"), _diff(shown)]
    body += [tag("details", tag("summary", "The event as queued"), tag("pre", as_json(row.event)))]
    return Shown(f"Dead letter {row.id}", body, notice=done)


def retry_row(settings: Settings, row_id: int, note: str) -> Handled:
    """Retry the row, as ``keylane dlq retry ID`` does."""
    return act_on_one(settings, row_id, retry(_by(), note or None))


def resolve_row(settings: Settings, row_id: int, note: str) -> Handled:
    """Resolve the row, as ``keylane dlq resolve ID --note NOTE`` does."""
    if not note:
        raise KeylaneError("say what was done about it: the note is kept on the row")
    return act_on_one(settings, row_id, resolve(_by(), note))


def what_was_done(verb: str, done: Handled) -> str:
    """An action's outcome, as a sentence."""
    said = {
        "queued": "queued again through its record's lane"
        if verb == "retry"
        else "queued: the record's release",
        "already queued": "already queued: nothing sent twice",
        "closed": "resolved",
        "skipped": "left as it was",
    }[done.outcome]
    return f"Dead letter {done.row_id}: {said}" + (f" ({done.detail})." if done.detail else ".")


def record_link(key: str) -> Html:
    """A record key, linking to the record's page."""
    return link(url("/record", key=key), key)


def _by() -> str:
    return f"{operator()} (web view)"


def _status(status: str) -> Html:
    return tag("span", status, class_=f"badge {status}")


def _about(shown: DeadLetterShown) -> Html:
    row, record = shown.row, shown.record
    pairs: list[tuple[str, Child]] = [
        ("Status", _status(row.status)),
        ("Reason", tag("code", row.reason)),
        (
            "Event",
            [
                link(url("/dead-letters", source=row.source, status=ANY), row.source),
                f"/{row.event_id} ({row.event.get('event_type', '?')})",
            ],
        ),
        ("Record", [record_link(row.record_key), f" (shard {row.shard})"]),
        ("Deliveries", link(url("/deliveries", source=row.source), f"of {row.source}")),
    ]
    if record is not None:
        now = "unknown" if record.error else record.version
        where = "" if record.where == "keylane" else f" (in {record.where})"
        revisions = f"read {row.revision_read}, found {row.revision_found}, now {now}{where}"
        pairs.append(("Revisions", revisions))
    else:
        pairs.append(("Sent to", str(row.event.get("destination"))))
    pairs += [("Attempts", row.attempts), ("Created", utc(row.created_at))]
    if row.retry_of is not None:
        pairs.append(("Retry of", link(f"/dead-letters/{row.retry_of}", row.retry_of)))
    if row.status != "open":
        closed = [row.status, " by ", row.status_by, " at ", utc(row.status_at)]
        pairs.append(("Handled", [*closed, f": {row.note}" if row.note else ""]))
    return facts(pairs)


def _actions(row: DeadLetter, token: str) -> Child:
    forms: list[Child] = []
    if row.status in ("open", "retried") and row.reason not in NOT_RETRYABLE:
        forms.append(
            _form(
                row,
                token,
                "retry",
                "Retry",
                "Send the event back through its record's lane, from a fresh read "
                "(it applies at most once).",
                required=False,
            )
        )
    if row.status == "open":
        forms.append(
            _form(
                row,
                token,
                "resolve",
                "Resolve",
                "Close the row as handled by hand (e.g. fixed in the CRM); a held record "
                "is released.",
                required=True,
            )
        )
    if row.reason in NOT_RETRYABLE and row.status == "open":
        forms.append(tag("p", f"Not retried: {NOT_RETRYABLE[row.reason]}.", class_="hint"))
    return tag("section", forms, class_="actions") if forms else None


def _form(row: DeadLetter, token: str, verb: str, label: str, what: str, required: bool) -> Html:
    note = tag(
        "input",
        type="text",
        name="note",
        required=required,
        placeholder="what was done (kept on the row)" if required else "why (optional)",
    )
    return tag(
        "form",
        tag("input", type="hidden", name="token", value=token),
        tag("p", what),
        tag("label", tag("span", "Note"), note),
        tag("button", label, type="submit", name="do", value=verb, class_=verb),
        method="post",
        action=f"/dead-letters/{row.id}/{verb}",
        class_="action",
    )


def _diff(shown: DeadLetterShown) -> Html:
    record = shown.record
    assert record is not None
    unknown = record.error is not None
    rows = [
        [
            tag("span", "*", title="applying it now changes this field")
            if d.differs and not unknown
            else "",
            tag("code", d.field),
            tag("code", as_json(d.change)),
            "(unknown)" if unknown else tag("code", _value(d.now)),
            "(unknown)" if unknown else tag("code", _value(d.would_be)),
        ]
        for d in shown.diffs
    ]
    note = tag("p", record.error, class_="empty") if unknown else None
    table_ = table(["", "field", "attempted change", "now", "would be"], rows, "No field changed.")
    return Html(str(note or "") + table_)


def _value(value: object) -> str:
    return value if isinstance(value, str) and value.startswith("(") else as_json(value)

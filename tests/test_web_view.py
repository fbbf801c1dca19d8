"""The web view on the operations listener, over HTTP against a real deployment (both
stores): every page shows what the CLI reads, filters and pages are URLs, everything a
sender or a record holds is shown as text, and the two actions do what ``keylane dlq``
does, only for the view's own pages."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from html import unescape
from urllib.parse import unquote

import httpx
import pytest

from tests.support.stack import Stack, wait_until
from tests.support.web_view import HOSTILE, HOSTILE_KEY, TOKEN, View, viewed_deployment


@pytest.fixture
def view(stack: Stack) -> Iterator[View]:
    with viewed_deployment(stack) as shown:
        yield shown


def _ids(html: str, pattern: str) -> list[str]:
    return [unquote(unescape(m)) for m in re.findall(pattern, html)]


@pytest.mark.slow
def test_the_deliveries_pages_show_what_keylane_deliveries_reads(view: View) -> None:
    # When the deliveries are listed, filtered by source, and paged two at a time
    listed = view.cli("deliveries", "list")["deliveries"]
    html = view.page("/deliveries")
    # Then each kept delivery is listed, newest first, linking to its page, times in UTC
    shown = _ids(html, r'href="/delivery\?id=([^"]+)"')
    assert shown == [d["id"] for d in listed]
    assert "UTC</time>" in html
    crm = _ids(view.page("/deliveries", source="crm"), r'href="/delivery\?id=([^"]+)"')
    assert crm == [d["id"] for d in listed if d["source"] == "crm"]
    assert "No delivery kept matches" in view.page("/deliveries", status="unverified")
    pages: list[str] = []
    visited = 0
    following: str | None = "/deliveries?limit=2"
    while following is not None:
        visited += 1
        html = view.page(unescape(following))
        pages += _ids(html, r'href="/delivery\?id=([^"]+)"')
        nxt = re.search(r'href="([^"]+)" rel="next"', html)
        following = nxt.group(1) if nxt else None
    assert pages == [d["id"] for d in listed]
    assert (len(listed), visited) == (7, 4)  # four pages of two, followed
    # And one delivery's page shows its request, its answer and its headers, as text
    first = next(d for d in listed if d["source"] == "demo")
    page = view.page("/delivery", id=first["id"])
    assert "POST /webhooks/demo" in page
    assert "400 invalid" in page
    assert "record_key is missing" in page
    assert HOSTILE not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "bad_" in page  # the body kept
    # And an accepted delivery's page shows the events it became, each with its outcome,
    # its record and its dead letter
    accepted = view.page("/deliveries", status="accepted", outcome="dead-lettered")
    (crm,) = [d for d in listed if d["source"] == "crm" and d["status_name"] == "accepted"]
    assert crm["id"] in _ids(accepted, r'href="/delivery\?id=([^"]+)"')
    page = view.page("/delivery", id=crm["id"])
    assert "crm_1" in page
    assert 'href="/record?key=contact%3A43"' in page
    assert "dead-lettered" in page
    assert re.search(r'href="/dead-letters/\d+">#\d+ not_owned', page)


@pytest.mark.slow
def test_the_dead_letter_pages_show_what_keylane_dlq_reads(view: View) -> None:
    rows = view.cli("dlq", "list")
    by_reason = {r["reason"]: r["id"] for r in rows}  # the two came in either order
    # When the dead letters are listed
    html = view.page("/dead-letters")
    # Then each open row is there, linking to its page and to its record's
    assert _ids(html, r'href="/dead-letters/(\d+)"') == [str(r["id"]) for r in rows]
    assert 'href="/record?key=contact%3A42"' in html
    # And filters are a URL: by reason, by record key, by status
    typed = view.page("/dead-letters", reason="type")
    assert _ids(typed, r'href="/dead-letters/(\d+)"') == [str(by_reason["type"])]
    assert _ids(view.page("/dead-letters", key="contact:43"), r'href="/dead-letters/(\d+)"') == [
        str(by_reason["not_owned"])
    ]
    assert "No resolved dead letter" in view.page("/dead-letters", status="resolved")
    # And a page of one row links to the next
    first = view.page("/dead-letters", limit=1)
    nxt = re.search(r'href="([^"]+)" rel="next"', first)
    assert nxt is not None
    assert _ids(view.page(unescape(nxt.group(1))), r'href="/dead-letters/(\d+)"') == [
        str(rows[1]["id"])  # oldest first: the second row
    ]
    # And one row's page shows what dlq show shows: the change beside the record now
    typed_id = by_reason["type"]
    shown = view.cli("dlq", "show", str(typed_id))
    page = view.page(f"/dead-letters/{typed_id}")
    assert shown["reason"] == "type"
    assert "visits" in page
    assert "&quot;many&quot;" in page
    assert "current value is text" in page
    assert f"read {shown['revision_read']}, found {shown['revision_found']}" in page
    # with the two actions, each a form posting this process's token
    assert f'action="/dead-letters/{typed_id}/retry"' in page
    assert f'action="/dead-letters/{typed_id}/resolve"' in page
    assert TOKEN.search(page) is not None
    # And a row that is not there is a 404, a filter that is not one a 400 saying why
    missing = view.get("/dead-letters/999999")
    assert missing.status_code == 404
    assert "no dead letter with id 999999" in missing.text
    bad = view.get("/dead-letters", status="bogus")
    assert bad.status_code == 400
    assert "status=bogus" in bad.text


@pytest.mark.slow
def test_the_record_pages_show_what_keylane_records_reads_as_text(view: View) -> None:
    # When the records are listed by prefix, and one is shown
    listed = view.cli("records", "list", "--prefix", "contact:")["records"]
    html = view.page("/records", prefix="contact:")
    # Then the list is the CLI's, in key order, each linking to its page
    assert _ids(html, r'href="/record\?key=([^"]+)"') == [r["key"] for r in listed]
    assert _ids(view.page("/records", where="email=a@b.c"), r'href="/record\?key=([^"]+)"') == [
        "contact:7"
    ]
    one = view.page("/records", prefix="contact:", limit=1)
    nxt = re.search(r'href="([^"]+)" rel="next"', one)
    assert nxt is not None
    assert "after=contact%3A42" in unescape(nxt.group(1))
    # And a record whose key and field are markup is shown as text, in the list and whole
    evil = view.page("/records", prefix="evil:")
    page = view.page("/record", key=HOSTILE_KEY)
    for html in (evil, page):
        assert HOSTILE not in html
        assert "<img" not in html
        assert "<script" not in html  # the view itself runs no script
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in page
    # And a record's page links to its dead letters; a key with none is a 404
    contact = view.page("/record", key="contact:42")
    assert 'href="/dead-letters?key=contact%3A42&amp;status=any"' in contact
    assert view.get("/record", key="nope:1").status_code == 404


@pytest.mark.slow
def test_every_page_is_served_on_the_operations_listener_only(view: View) -> None:
    # When the home page, the stylesheet and each list are asked for
    home = view.get("/")
    css = view.get("/web.css")
    # Then they are there, with headers that let no script run nor another site frame them
    assert home.status_code == 200
    assert "2 open" in home.text
    assert "script-src" not in home.headers["content-security-policy"]
    assert "default-src 'none'" in home.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in home.headers["content-security-policy"]
    assert css.headers["content-type"].startswith("text/css")
    assert "@media" in css.text
    # And none of it is on the webhook port, and /metrics is where it was
    for path in ("/", "/deliveries", "/dead-letters", "/records", "/web.css"):
        assert httpx.get(f"{view.stack.url}{path}", timeout=10).status_code in (404, 405), path
    assert view.get("/metrics").status_code == 200
    # And a name that is not the listener's (a rebound DNS name) gets no page at all
    rebound = view.http.get(f"{view.base}/records", headers={"host": "attacker.example:8100"})
    assert rebound.status_code == 421
    assert "attacker.example" in rebound.text


@pytest.mark.slow
def test_retry_and_resolve_do_what_keylane_dlq_does(view: View) -> None:
    rows = view.cli("dlq", "list")
    by_reason = {r["reason"]: r["id"] for r in rows}
    typed, not_owned = by_reason["type"], by_reason["not_owned"]
    token = view.token(typed)
    own = {"origin": view.base, "sec-fetch-site": "same-origin"}
    # Given the record the type row is about, fixed by hand
    assert view.stack.keylane("records", "set", "contact:42", "visits=1").returncode == 0
    # When a form is posted without the token, with another's, from another site, or
    # from another origin
    refused = [
        view.post(f"/dead-letters/{typed}/retry", {"note": "x"}, **own),
        view.post(f"/dead-letters/{typed}/retry", {"token": "forged", "note": "x"}, **own),
        view.post(
            f"/dead-letters/{typed}/retry",
            {"token": token},
            origin=view.base,
            **{"sec-fetch-site": "cross-site"},
        ),
        view.post(f"/dead-letters/{typed}/retry", {"token": token}, origin="http://evil.example"),
        view.post(f"/dead-letters/{typed}/resolve", {"token": token, "note": "x"}, origin="null"),
    ]
    # Then each is refused, says why, and the row is as it was
    assert [r.status_code for r in refused] == [403] * 5
    assert "token" in refused[0].text
    assert "Sec-Fetch-Site: cross-site" in refused[2].text
    assert "http://evil.example" in refused[3].text
    assert view.cli("dlq", "show", str(typed))["status"] == "open"
    # And a GET of an action is not one
    assert view.get(f"/dead-letters/{typed}/retry").status_code == 405
    # When the row is retried from its page
    done = view.post(f"/dead-letters/{typed}/retry", {"token": token, "note": "fixed"}, **own)
    # Then the page says what was done, the row is retried, and its event applied
    assert done.status_code == 200, done.text
    assert f"Dead letter {typed}: queued again through its record" in done.text
    assert view.cli("dlq", "show", str(typed))["status"] == "retried"
    wait_until(
        lambda: view.cli("records", "get", "contact:42")["fields"] == {"visits": 2},
        60,
        "the retried increment applied",
        on_timeout=view.stack.logs,
    )
    # And a second retry queues nothing twice
    again = view.post(f"/dead-letters/{typed}/retry", {"token": token}, **own)
    assert "already queued: nothing sent twice" in again.text
    # When the other row is resolved without a note, then with one
    empty = view.post(f"/dead-letters/{not_owned}/resolve", {"token": token, "note": " "}, **own)
    resolved = view.post(
        f"/dead-letters/{not_owned}/resolve", {"token": token, "note": "set by hand"}, **own
    )
    # Then the first is refused (a note is what dlq resolve asks too), the second done,
    # kept on the row with who did it
    assert empty.status_code == 400
    assert "say what was done" in empty.text
    assert resolved.status_code == 200
    assert f"Dead letter {not_owned}: resolved." in resolved.text
    row = view.cli("dlq", "show", str(not_owned))
    assert (row["status"], row["note"]) == ("resolved", "set by hand")
    assert row["status_by"].endswith("(web view)")
    assert 'action="/dead-letters' not in view.page(f"/dead-letters/{not_owned}")
    # And a client that sends neither Origin nor Sec-Fetch-Site (curl) needs the token only
    assert view.post(f"/dead-letters/{typed}/retry", {"token": token}).status_code == 200


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_setting_turns_the_view_off(stack: Stack) -> None:
    # Given a receiver whose web view is off (KEYLANE_WEB_VIEW=false)
    stack.receiver(web_view="false")
    # When its operations listener is asked for the view's pages
    answers = [httpx.get(f"{stack.ops_url}{p}", timeout=10) for p in ("/", "/dead-letters")]
    # Then there are none, and /metrics is served as before
    assert [a.status_code for a in answers] == [404, 404]
    assert httpx.get(f"{stack.ops_url}/metrics", timeout=10).status_code == 200


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_a_page_waiting_on_the_store_does_not_hold_up_the_listener(stack: Stack) -> None:
    import psycopg

    # Given a receiver whose store reads may wait long (PostgreSQL: a lock is waited for)
    stack.receiver(store_timeout_ms=30_000, inflight_deadline_ms=600_000)
    stack.open_store().migrate()
    with psycopg.connect(stack.settings.store_dsn()) as holder:
        # and the dead letters' table locked by another transaction
        holder.execute("LOCK TABLE dead_letters IN ACCESS EXCLUSIVE MODE")
        # When the dead letters page is asked for (its read waits on the lock)
        answers: list[httpx.Response] = []
        waiting = threading.Thread(
            target=lambda: answers.append(httpx.get(f"{stack.ops_url}/dead-letters", timeout=90))
        )
        waiting.start()
        try:
            wait_until(lambda: _lock_waiters(stack) > 0, 30, "the page's read to wait")
            # Then the listener still answers at once, its page read still waiting
            metrics = httpx.get(f"{stack.ops_url}/metrics", timeout=10)
            home = httpx.get(f"{stack.ops_url}/web.css", timeout=10)
            assert (metrics.status_code, home.status_code) == (200, 200)
            assert waiting.is_alive()
            assert _lock_waiters(stack) > 0
        finally:
            holder.rollback()  # the lock let go
            waiting.join(90)
    # And once the lock is let go the page is served
    assert [a.status_code for a in answers] == [200]


def _lock_waiters(stack: Stack) -> int:
    import psycopg

    with psycopg.connect(stack.settings.store_dsn()) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON l.relation = c.oid "
            "WHERE c.relname = 'dead_letters' AND c.relnamespace = current_schema()::regnamespace "
            "AND NOT l.granted"
        ).fetchone()
    assert row is not None
    return int(row[0])

"""A task whose records are elsewhere (``tests/test_merges.py``): a CRM, here a SQLite file
at ``TEST_CRM_DB``, that keeps one row per contact key, appends each event's number to the
list its sender names, and merges two contacts when keylane says they are one person. It
honours the idempotency key, as a CRM's API may: a call repeated after a crash (between
the call and keylane's journal entry) has no second effect."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any

import keylane


def crm() -> sqlite3.Connection:
    """The CRM's database (its tables made on first use)."""
    conn = sqlite3.connect(os.environ["TEST_CRM_DB"], timeout=60, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS contacts (key TEXT PRIMARY KEY, fields TEXT)")
    conn.execute("CREATE TABLE IF NOT EXISTS merges (survivor TEXT, absorbed TEXT, at REAL)")
    conn.execute("CREATE TABLE IF NOT EXISTS done (idempotency_key TEXT PRIMARY KEY)")
    return conn


def _first_time(conn: sqlite3.Connection, ctx: keylane.Context) -> bool:
    """In the call's transaction: whether its key is new (then it is remembered)."""
    try:
        conn.execute("INSERT INTO done VALUES (?)", (ctx.idempotency_key,))
    except sqlite3.IntegrityError:
        return False
    return True


def _fields(conn: sqlite3.Connection, key: str) -> dict[str, Any] | None:
    row = conn.execute("SELECT fields FROM contacts WHERE key = ?", (key,)).fetchone()
    return None if row is None else dict(json.loads(row[0]))


def _put(conn: sqlite3.Connection, key: str, fields: dict[str, Any]) -> None:
    conn.execute(
        "INSERT INTO contacts (key, fields) VALUES (?, ?) "
        "ON CONFLICT (key) DO UPDATE SET fields = excluded.fields",
        (key, json.dumps(fields)),
    )


def merge_people(event: keylane.Event, ctx: keylane.Context) -> dict[str, Any]:
    """The CRM's merge: the survivor takes the fields it lacks, the other contact goes."""
    assert event.merge is not None
    survivor, absorbed = event.merge.survivor, event.merge.absorbed
    conn = crm()
    try:
        conn.execute("BEGIN IMMEDIATE")
        if not _first_time(conn, ctx):
            conn.execute("ROLLBACK")
            return {"took": "done before"}
        mine = _fields(conn, survivor) or {}
        theirs = _fields(conn, absorbed) or {}
        _put(conn, survivor, {**theirs, **mine})
        conn.execute("DELETE FROM contacts WHERE key = ?", (absorbed,))
        conn.execute("INSERT INTO merges VALUES (?, ?, ?)", (survivor, absorbed, time.time()))
        conn.execute("COMMIT")
    finally:
        conn.close()
    return {"took": sorted(set(theirs) - set(mine))}


@keylane.task(key="person:{email}", on_merge=merge_people)
def sync_person(event: keylane.Event, ctx: keylane.Context) -> None:
    """Append the event's number to its sender's list on the contact (``event.record_key``:
    the survivor's, once its key was merged)."""
    payload = event.payload
    conn = crm()
    try:
        conn.execute("BEGIN IMMEDIATE")
        if not _first_time(conn, ctx):
            conn.execute("ROLLBACK")
            return
        fields = _fields(conn, event.record_key) or {}
        fields.setdefault(payload["list"], []).append(payload["n"])
        _put(conn, event.record_key, fields)
        conn.execute("COMMIT")
    finally:
        conn.close()

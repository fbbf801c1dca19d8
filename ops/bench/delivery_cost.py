"""What keeping accepted deliveries costs: ``python -m keylane.ops.bench.delivery_cost``.

* **In the store**: bytes per kept delivery in the ``deliveries`` table (its row, its
  primary key and age index; PostgreSQL: with TOAST), for a small JSON body and one at the
  16 KiB cap, headers as Stripe sends them: ``--rows`` deliveries kept in a fresh SQLite
  file (its pages: ``PRAGMA page_count``, the WAL's included) and a fresh PostgreSQL schema
  (``pg_total_relation_size``; ``--pg-url``, default ``KEYLANE_TEST_PG_URL`` or the test
  database, skipped when it does not answer).
* **On the queue**: the bytes of one event's message before (no delivery id, no request:
  the message of keylane before deliveries were kept, and of a source whose window is
  ``off`` but for its 30-byte id) and after (the default window, ``errors``: every event
  carries its delivery's request, since whether it is kept is decided by its outcome).
* **In CPU**: the worker's decoding of one event's message (``parse_message`` and
  ``Event.model_validate``, what a lane does per event) before and after, and the
  receiver's making of the request it carries; alternated in one run, the median of
  ``--rounds``, printed side by side as a ratio.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import string
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...producers.accept import new_event
from ...routing import ShardMap
from ...routing.contract.door import DOOR_BODY_MAX_BYTES
from ...routing.contract.events import Event
from ...routing.contract.kept_deliveries import kept_request, new_delivery_id
from ...routing.contract.message import event_message, parse_message
from ...routing.contract.signing import PresetConfig
from ...workers.stores import open_store
from ...workers.stores.sql import SqlStore
from ...workers.stores.sql_deliveries import keep_delivery
from .door_memory import HEADERS, body_of

PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/test"
SIZES: tuple[tuple[str, int | None], ...] = (
    ("small JSON", None),
    ("16 KiB cap", DOOR_BODY_MAX_BYTES),
)
STRIPE = PresetConfig(scheme="stripe", secrets_env=("STRIPE_SECRET",))


def body_at(n: int, size: int | None) -> bytes:
    """A small JSON event (``size`` None), or one cut to ``size`` bytes whose padding is
    random text, compressed as little as a real body (PostgreSQL compresses large values)."""
    if size is None:
        return body_of(n, None)
    pad = "".join(random.Random(n).choices(string.ascii_letters + string.digits, k=size))
    return body_of(n, None)[:-1] + b', "pad": "' + pad.encode() + b'"}'


def request_of(n: int, size: int | None, body: bytes | None = None) -> dict[str, Any]:
    """The request an event of delivery ``n`` carries (Stripe's headers)."""
    return kept_request(
        window="errors",
        verify=STRIPE,
        method="POST",
        path="/webhooks/stripe",
        query=b"",
        headers=HEADERS,
        body=body if body is not None else body_at(n, size)[: size or None],
    )


def store_bytes(store: SqlStore, rows: int, size: int | None, used: Callable[[], int]) -> float:
    """Bytes per delivery of ``rows`` kept in ``store``'s ``deliveries`` table."""
    before = used()
    dialect = store.dialect
    for start in range(0, rows, 100):
        with dialect.transaction() as cur:
            for n in range(start, min(rows, start + 100)):
                keep_delivery(
                    dialect, cur, new_delivery_id("stripe"), "stripe", request_of(n, size)
                )
    return (used() - before) / rows


def sqlite_figures(rows: int) -> list[float]:
    """Bytes per kept delivery in a fresh SQLite store, per body size."""
    found = []
    for _, size in SIZES:
        with tempfile.TemporaryDirectory() as folder:
            store = open_store(f"sqlite:///{Path(folder) / 'bench.db'}")
            store.migrate()

            def used(store: SqlStore = store) -> int:
                with store.dialect.cursor() as cur:
                    cur.execute("PRAGMA page_count")
                    pages = int(cur.fetchone()[0])
                    cur.execute("PRAGMA page_size")
                    return pages * int(cur.fetchone()[0])

            found.append(store_bytes(store, rows, size, used))
            store.close()
    return found


def postgres_figures(rows: int, url: str) -> list[float] | None:
    """Bytes per kept delivery in a fresh PostgreSQL schema (None: no database)."""
    try:
        admin = open_store(url)
    except Exception as exc:  # the figure is left out, and said why
        print(f"postgresql: skipped ({exc})")
        return None
    found = []
    try:
        for _, size in SIZES:
            schema = f"kl_bench_{uuid.uuid4().hex[:10]}"
            with admin.dialect.transaction() as cur:
                cur.execute(f'CREATE SCHEMA "{schema}"')
            sep = "&" if "?" in url else "?"
            store = open_store(f"{url}{sep}options=-csearch_path%3D{schema}")
            try:
                store.migrate()

                def used(store: SqlStore = store) -> int:
                    with store.dialect.cursor() as cur:
                        cur.execute("SELECT pg_total_relation_size('deliveries')")
                        return int(cur.fetchone()[0])

                found.append(store_bytes(store, rows, size, used))
            finally:
                store.close()
                with admin.dialect.transaction() as cur:
                    cur.execute(f'DROP SCHEMA "{schema}" CASCADE')
    finally:
        admin.close()
    return found


def message_of(n: int, size: int | None, carried: bool) -> bytes:
    """One event's shard message, with (``carried``) or without its delivery."""
    event = new_event(
        ShardMap(64),
        source="stripe",
        event_id=f"evt_{n:08d}",
        event_type="customer.updated",
        record_key=f"customer:{n}",
        body_sha256="0" * 64,
        changes={"email": {"op": "set", "value": f"user{n}@example.com"}},
        delivery=new_delivery_id("stripe") if carried else None,
        request=request_of(n, size) if carried else None,
    )
    wire = event.wire
    if not carried:  # as before: no such fields at all
        wire = {k: v for k, v in wire.items() if k not in ("delivery", "request")}
    return event_message(wire, event.queue)


def decode_us(messages: list[bytes]) -> float:
    """Microseconds per message of a lane's decoding."""
    started = time.perf_counter()
    for raw in messages:
        Event.model_validate(parse_message(raw).kwargs["event"])
    return (time.perf_counter() - started) / len(messages) * 1e6


def request_us(bodies: list[bytes]) -> float:
    """Microseconds per delivery of making the request its events carry (the receiver's
    part: redacting, hashing, cutting the body; the bodies made beforehand)."""
    started = time.perf_counter()
    for n, body in enumerate(bodies):
        request_of(n, None, body)
    return (time.perf_counter() - started) / len(bodies) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pg-url", default=os.environ.get("KEYLANE_TEST_PG_URL", PG_DEFAULT))
    args = parser.parse_args()
    print(f"store: bytes per kept delivery ({args.rows} kept, headers as Stripe sends them)")
    lite = sqlite_figures(args.rows)
    pg = postgres_figures(args.rows, args.pg_url)
    for i, (name, size) in enumerate(SIZES):
        body = len(body_at(0, size)[: size or None])
        pg_text = "-" if pg is None else f"{pg[i]:.0f}"
        print(f"  {name} body ({body} bytes): sqlite {lite[i]:.0f}, postgresql {pg_text}")
    print("queue and worker CPU per event, before (no delivery carried) -> after (errors)")
    for name, size in SIZES:
        before = [message_of(n, size, False) for n in range(args.events)]
        after = [message_of(n, size, True) for n in range(args.events)]
        old_b, new_b = len(before[0]), len(after[0])
        olds, news = [], []
        for _ in range(args.rounds):  # alternated: the machine's load falls on both
            olds.append(decode_us(before))
            news.append(decode_us(after))
        old_us, new_us = statistics.median(olds), statistics.median(news)
        bodies = [body_at(n, size)[: size or None] for n in range(args.events)]
        made = statistics.median(request_us(bodies) for _ in range(args.rounds))
        print(
            f"  {name} body: message {old_b} -> {new_b} bytes ({new_b / old_b:.2f}x); "
            f"lane decode {old_us:.1f} -> {new_us:.1f} us ({new_us / old_us:.2f}x); "
            f"receiver makes the request in {made:.1f} us"
        )


if __name__ == "__main__":
    main()

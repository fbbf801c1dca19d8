"""Redis memory per refusal kept at the door: ``python -m keylane.ops.bench.door_memory``.

Fills a stream with ``--entries`` entries as the receiver writes them
(``routing/contract/door.py``, headers as Stripe sends them) for three kinds of refusal,
and prints ``MEMORY USAGE`` of the stream (``SAMPLES 0``: every entry counted) divided by
the entries. Uses ``KEYLANE_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) and a key
of its own, deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import uuid
from typing import Any

import redis

from ...routing.contract.door import DOOR_BODY_MAX_BYTES, door_entry, redact_headers
from ...routing.contract.replies import reply_int

HEADERS = {
    "host": "hooks.example.com",
    "user-agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
    "content-type": "application/json; charset=utf-8",
    "content-length": "154",
    "accept": "*/*",
    "stripe-signature": "t=1765126200,v1=" + "a" * 64,
    "x-forwarded-for": "203.0.113.7",
    "accept-encoding": "gzip",
}


def body_of(n: int, size: int | None) -> bytes:
    """A small JSON event (``size`` None), or one padded and cut to ``size`` bytes."""
    event = {
        "id": f"evt_{n:08d}",
        "type": "customer.updated",
        "record_key": f"customer:{n}",
        "changes": {"email": {"set": f"user{n}@example.com"}, "plan": {"set": "pro"}},
    }
    if size is None:
        return json.dumps(event).encode()
    return json.dumps({**event, "pad": "x" * size}).encode()[:size]


def measure(client: redis.Redis, count: int, size: int | None, status: int) -> tuple[int, int]:
    """The body's size and the stream's bytes with ``count`` refusals of ``status``."""
    key = f"kl-bench:door:{uuid.uuid4().hex}"
    pipe = client.pipeline(transaction=False)
    for n in range(count):
        entry = door_entry(
            source="stripe",
            method="POST",
            path="/webhooks/stripe",
            query="",
            headers=redact_headers(HEADERS, frozenset({"stripe-signature"})),
            status=status,
            code="invalid" if status == 400 else "bad_signature",
            detail="record_key is missing" if status == 400 else "no signature matched",
            body=body_of(n, size),
            verified=status != 401,
        )
        fields: dict[Any, Any] = dict(entry)
        pipe.xadd(key, fields, maxlen=count, approximate=False)
    pipe.execute()
    used = reply_int(client.memory_usage(key, samples=0))
    client.delete(key)
    return len(body_of(0, size)), used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1000)
    args = parser.parse_args()
    client = redis.Redis.from_url(os.environ.get("KEYLANE_REDIS_URL", "redis://127.0.0.1:6379/0"))
    server: Any = client.info("server")  # (typed as an Awaitable too before redis-py 8)
    print(f"redis {server['redis_version']}, {args.entries} entries per stream")
    for name, size, status in (
        ("400, a small JSON body", None, 400),
        ("401, metadata only", None, 401),
        ("400, a body at the cap", DOOR_BODY_MAX_BYTES, 400),
    ):
        body, used = measure(client, args.entries, size, status)
        print(f"{name} ({body} bytes): {used} bytes, {used / args.entries:.0f} bytes per entry")
    client.close()


if __name__ == "__main__":
    main()

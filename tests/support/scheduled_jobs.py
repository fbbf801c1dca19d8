"""Scheduled jobs and a repair for the scheduler tests, imported by real scheduler and
worker processes (``-A tests.support.scheduled_jobs``). ``TEST_JOBS`` names the ones to
register (comma-separated); what they do is noted in the test's Redis namespace
(``<namespace>:test:notes``, JSON lines) so the test can check it afterwards."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import redis

import keylane

ENABLED = set(os.environ.get("TEST_JOBS", "").split(","))
EVERY = os.environ.get("TEST_JOB_EVERY", "2s")
#: How long a slow job's run takes, in seconds: "min,max" (spread over the runs).
DURATION = [float(x) for x in os.environ.get("TEST_JOB_DURATION", "2.5,5").split(",")]
RECORDS = int(os.environ.get("TEST_JOB_RECORDS", "4"))

_client: redis.Redis | None = None


def note(kind: str, **fields: Any) -> None:
    """Append a note for the test (in its own Redis namespace)."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(os.environ["KEYLANE_REDIS_URL"])
    entry = {"kind": kind, "pid": os.getpid(), "role": os.environ.get("TEST_ROLE"), **fields}
    _client.rpush(f"{os.environ['KEYLANE_NAMESPACE']}:test:notes", json.dumps(entry))


def notes(client: redis.Redis, namespace: str) -> list[dict[str, Any]]:
    """Every note so far, in order."""
    return [json.loads(x) for x in client.lrange(f"{namespace}:test:notes", 0, -1)]


def slow_run(run: keylane.Run) -> None:
    """A run longer than the interval: one event per record, spread over its duration
    (which varies from tick to tick), each the run's tick appended to the record."""
    low, high = DURATION
    seconds = low + (high - low) * ((run.info.tick_ms // 1000) % 7) / 6
    note("start", job=run.job, tick=run.tick, attempt=run.attempt, at=time.time())
    for i in range(RECORDS):
        run.change(f"{run.job}:{i}", {"runs": {"increment": 1}, "ticks": {"append": run.tick}})
        note("sent", job=run.job, tick=run.tick, attempt=run.attempt, n=i + 1)
        time.sleep(seconds / RECORDS)
    note("end", job=run.job, tick=run.tick, attempt=run.attempt, at=time.time())


def full_name_check(record: keylane.Record) -> dict[str, Any] | None:
    """A repair: ``full`` must be ``first + " " + last``. Notes every record it sees."""
    fields = record.fields
    note("saw", key=record.key, revision=record.revision, fields=fields, argv=sys.argv[-1])
    if "first" not in fields:
        return None
    wanted = f"{fields['first']} {fields.get('last', '')}"
    if fields.get("full") == wanted:
        return None
    return {"full": {"set": wanted}, "repairs": {"increment": 1}}


for _name, _overlap in (("slow_skip", "skip"), ("slow_buffer", "buffer_one")):
    if _name in ENABLED:
        keylane.schedule(every=EVERY, overlap=_overlap, name=_name, owns=["runs", "ticks"])(
            slow_run
        )
if "full_name" in ENABLED:
    keylane.repair(every=EVERY, owns=["full", "repairs"], name="full_name", prefix="acct:")(
        full_name_check
    )

"""Repairs through the record's lane, with real processes: a sweep that runs every second
during a burst of multi-field updates to the same records never repairs a record in the
middle of an update. Its repair events take their place in each record's lane, the check
runs again on the lane's fresh read, and the records end as applying every event (the
updates and the repairs) one after the other in lane order gives."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest
import redis

from tests.support.scheduled_jobs import notes
from tests.support.stack import Stack, event, wait_until

pytestmark = pytest.mark.slow

APP = "tests.support.scheduled_jobs"
RECORDS, UPDATES = 8, 40


def _update(i: int, k: int) -> dict[str, Any]:
    """Update k of record i: first, last and full together (one event), and a count.
    Every fourth one, and the last, is written by a buggy sync: ``full`` left empty."""
    first, last = f"F{i}.{k}", f"L{k}"
    buggy = k % 4 == 3 or k == UPDATES - 1
    return {
        "first": {"set": first},
        "last": {"set": last},
        "full": {"set": "" if buggy else f"{first} {last}"},
        "n": {"increment": 1},
    }


def _apply(fields: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(fields)
    for name, change in changes.items():
        ((op, value),) = change.items()
        out[name] = value if op == "set" else out.get(name, 0) + value
    return out


def _check(fields: dict[str, Any]) -> dict[str, Any] | None:
    """The repair's check, without its notes (tests.support.scheduled_jobs)."""
    if "first" not in fields:
        return None
    wanted = f"{fields['first']} {fields.get('last', '')}"
    if fields.get("full") == wanted:
        return None
    return {"full": {"set": wanted}, "repairs": {"increment": 1}}


def _send_updates(stack: Stack, i: int, errors: list[str]) -> None:
    with httpx.Client(timeout=30) as client:
        for k in range(UPDATES):
            body = event(f"u:{i}:{k}", f"acct:{i}", **_update(i, k))
            answer = stack.post(body, client=client, retries=5)
            if answer.status_code != 202:
                errors.append(f"{i}/{k}: {answer.status_code} {answer.text}")
            # most broken states last a moment, some long enough for a sweep to find them
            time.sleep(1.2 if k % 8 == 7 else 0.05)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_sweep_during_a_burst_never_repairs_a_record_mid_update(stack: Stack) -> None:
    # Given a repair that makes `full` agree with `first` and `last`, swept every second
    stack.extra_env.update(TEST_JOBS="full_name", TEST_JOB_EVERY="1s", TEST_ROLE="worker")
    stack.worker(app=APP)
    stack.extra_env["TEST_ROLE"] = "scheduler"
    stack.scheduler(app=APP)
    stack.receiver()
    # When a burst of multi-field updates hits the same records (one sender per record,
    # in order), a quarter of them written broken by a buggy sync, the last one too
    errors: list[str] = []
    senders = [
        threading.Thread(target=_send_updates, args=(stack, i, errors)) for i in range(RECORDS)
    ]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join()
    assert errors == []
    store = stack.open_store()

    def repaired() -> bool:
        records = [store.read(f"acct:{i}").fields for i in range(RECORDS)]
        return all(r.get("n") == UPDATES and _check(r) is None for r in records)

    # Then the sweeps repair every record once the burst is over
    wait_until(repaired, 120, "every record repaired", on_timeout=stack.logs)
    seen = notes(redis.Redis.from_url(stack.settings.redis_dsn()), stack.settings.namespace)
    repairs_written = repairs_mid_burst = 0
    for i in range(RECORDS):
        key = f"acct:{i}"
        entries = store.journal_entries(key)
        updates = Counter(e.event_id for e in entries if e.source == "demo")
        # And every update was applied once
        assert updates == Counter(f"u:{i}:{k}" for k in range(UPDATES))
        # And replaying the record's events one after the other in lane order (the
        # revisions; a batch of updates shares one, in send order) gives the record
        writes = sorted(
            (e for e in entries if e.revision is not None),
            key=lambda e: (
                e.revision,
                int(e.event_id.rsplit(":", 1)[1]) if e.source == "demo" else 0,
            ),
        )
        state: dict[str, Any] = {}
        states = [dict(state)]
        for entry in writes:
            if entry.source == "demo":
                state = _apply(state, _update(i, int(entry.event_id.rsplit(":", 1)[1])))
            else:
                assert entry.source == "full_name"
                change = _check(state)
                assert change is not None, f"{key}: a repair was written to a sound record"
                state = _apply(state, change)
                repairs_written += 1
                repairs_mid_burst += state.get("n") != UPDATES
            states.append(dict(state))
        assert state == store.read(key).fields
        # And every record state the check ever saw, in the lane or in a sweep, is one of
        # those whole states: never the middle of an update
        for note in (n for n in seen if n["kind"] == "saw" and n["key"] == key):
            assert note["fields"] in states, note
    lane_checks = [n for n in seen if n["kind"] == "saw" and n["role"] == "worker"]
    sweep_reads = [n for n in seen if n["kind"] == "saw" and n["role"] == "scheduler"]
    print(f"repairs written {repairs_written} ({repairs_mid_burst} before a record's last update)")
    assert repairs_written >= RECORDS  # the last, broken update of each record was repaired
    assert repairs_mid_burst > 0  # the sweeps ran during the burst, between updates
    assert len(lane_checks) >= repairs_written
    assert len(sweep_reads) > len(lane_checks)
    # And the sweeps show in /metrics and keylane status
    metrics = httpx.get(f"{stack.ops_url}/metrics", timeout=10).text
    assert 'keylane_schedule_runs_total{job="full_name",outcome="ok"}' in metrics
    states_shown = [s for s in stack.view().schedules() if not s.job.startswith("keylane.")]
    assert [s.job for s in states_shown] == ["full_name"]
    assert states_shown[0].runs["ok"] > 3

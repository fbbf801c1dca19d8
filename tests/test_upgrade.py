"""An upgrade with events in flight loses nothing: keylane 0.1.0 (commit 44bfee1, built
from this repository's history into a venv of its own) runs a deployment, writes its
store, its journal, a dead letter and merges, and has events queued and in flight; then
its workers and its receivers are replaced by the current code one at a time, in the
documented order (CHANGELOG.md, "Upgrading": workers first, receivers after), while a
sender keeps sending. On both stores: every accepted event applied exactly once, in
order; replays of 0.1.0's events still recognised; its dead letter and merges readable
(and a merge it made still forwards); and while a worker of 0.1.0 ran, a receiver of
this release wrote the wire version it reads."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from keylane.workers.store_rows import DeadLetterFilter
from tests.support.releases import release_commit, release_env, release_environ
from tests.support.stack import LISTENING, Proc, Stack, event, settings_env, wait_until

pytestmark = pytest.mark.slow

RECORDS = 20


@pytest.fixture(scope="module")
def previous_python() -> Path:
    """The Python of a venv where keylane 0.1.0 is installed."""
    commit = release_commit()
    if commit is None:
        pytest.skip("this clone has no history of the previous release (44bfee1)")
    return release_env(commit)


class Old:
    """Processes of keylane 0.1.0 beside the stack's own: they stop with it."""

    def __init__(self, stack: Stack, python: Path, tmp_path: Path) -> None:
        self.stack = stack
        self.python = python
        self.home = tmp_path / "old"  # not the checkout: its keylane/ would shadow 0.1.0's
        self.home.mkdir()

    def _spawn(self, name: str, *args: str) -> Proc:
        n = sum(1 for p in self.stack.procs if p.name.startswith(name))
        proc = Proc(
            f"{name}-{n}",
            [str(self.python), "-m", "keylane.ops.cli", *args],
            release_environ(settings_env(self.stack.settings)),
            self.stack.tmp / f"{name}-{n}.log",
            cwd=self.home,
        )
        self.stack.procs.append(proc.start())
        return proc

    def worker(self) -> Proc:
        return self._spawn("old-worker", "worker", "--lanes", "4")

    def receiver(self) -> tuple[Proc, str]:
        proc = self._spawn("old-receiver", "serve", "--port", "0")
        wait_until(lambda: LISTENING.search(proc.log()) or not proc.alive(), 60, "old receiver")
        found = LISTENING.search(proc.log())
        assert found is not None, proc.log()
        assert proc.alive(), proc.log()
        url = f"http://127.0.0.1:{found.group(1)}"
        wait_until(lambda: _healthy(url), 30, "the old receiver to answer")
        return proc, url


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class Sender:
    """One sender posting events in order (the n-th to contact:<n mod RECORDS>, appending
    n), each retried (same id, same body) on the next live receiver until accepted, while
    receivers come and go; what was accepted, in the order it was."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.accepted: list[int] = []
        self.refused: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sender:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive()

    def _run(self) -> None:
        n, turn = 0, 0
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                body = event(f"u-{n}", f"contact:{n % RECORDS}", visits={"increment": 1})
                body["changes"]["seq"] = {"append": n}
                while True:  # this event until accepted, as a provider retries it
                    turn += 1
                    url = self.urls[turn % len(self.urls)]
                    try:
                        answer = client.post(f"{url}/webhooks/demo", json=body)
                    except httpx.HTTPError:
                        time.sleep(0.05)
                        continue
                    if answer.status_code in (200, 202):
                        break
                    self.refused.append(f"{answer.status_code} {answer.text[:200]}")
                    time.sleep(0.05)
                self.accepted.append(n)
                n += 1
                time.sleep(0.005)


def _post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/webhooks/demo", json=body, timeout=30)


def _gauge(ops_url: str) -> float:
    for line in httpx.get(f"{ops_url}/metrics", timeout=10).text.splitlines():
        if line.startswith("keylane_wire_version "):
            return float(line.split()[1])
    raise AssertionError("no keylane_wire_version")


FIRST_DAYS = [
    # contact:dl: an increment of a text field, a dead letter of 0.1.0's
    event("dl-1", "contact:dl", name={"set": "Ada"}),
    event("dl-2", "contact:dl", name={"increment": 1}),
    # person:a and person:b share an email and differ in nothing: merged at once
    {**event("pa-1", "person:a", plan={"set": "pro"}), "also": ["email:a@example.com"]},
    {**event("pb-1", "person:b", city={"set": "Oslo"}), "also": ["email:a@example.com"]},
    # person:c and person:d share an email and differ in name: a merge for a person
    {**event("pc-1", "person:c", name={"set": "C"}), "also": ["email:c@example.com"]},
    {**event("pd-1", "person:d", name={"set": "D"}), "also": ["email:c@example.com"]},
]


# The run takes 1 to 2.5 minutes; building 0.1.0's venv the first time on a machine
# (tests/support/releases.py) takes a few more, once.
@pytest.mark.timeout(900)
def test_an_upgrade_from_0_1_0_with_events_in_flight_loses_nothing(
    stack: Stack, previous_python: Path, tmp_path: Path
) -> None:
    old = Old(stack, previous_python, tmp_path)
    workers = stack.writers(2)  # SQLite takes one writer process
    # Given a deployment of keylane 0.1.0: a receiver and its workers
    old_workers = [old.worker() for _ in range(workers)]
    old_receiver, old_url = old.receiver()
    stack.wait_all_owned(workers=workers, timeout_s=60)
    # ... that applied a first batch: a dead letter, a merge, a merge for a person
    for body in FIRST_DAYS:
        assert _post(old_url, body).status_code == 202
    store = stack.open_store()
    store.migrate()
    wait_until(
        lambda: len(store.dead_letters(DeadLetterFilter(statuses=("open",)))) >= 2,
        60,
        "0.1.0's dead letter and merge review",
        on_timeout=stack.logs,
    )
    wait_until(
        lambda: store.read("person:b").merged_into or store.read("person:a").merged_into,
        60,
        "0.1.0's merge",
        on_timeout=stack.logs,
    )
    # ... and a sender sending all along, through whichever receivers are up
    urls = [old_url]
    sender = Sender(urls).start()
    try:
        wait_until(lambda: len(sender.accepted) >= 100, 60, "the sender to get going")

        # When a receiver of this release joins while the 0.1.0 workers run
        stack.receiver()
        new_url, new_ops = stack.url, stack.ops_url
        urls.append(new_url)
        # Then it writes the wire version they read
        assert _gauge(new_ops) == 1
        # And an id the 0.1.0 receiver remembered is a duplicate to it (0.1.0's marks read)
        by_old = event("u-old", "contact:mixed", visits={"increment": 1})
        assert _post(old_url, by_old).status_code == 202
        replayed = _post(new_url, by_old)
        assert replayed.status_code == 200, replayed.text
        assert replayed.headers.get("keylane-replayed") == "true"
        # And one it accepted (remembered its compact way, which 0.1.0 does not read) sent
        # to the 0.1.0 receiver is queued again there, and applied once all the same
        by_new = event("u-new", "contact:mixed", visits={"increment": 1})
        assert _post(new_url, by_new).status_code == 202
        assert _post(old_url, by_new).status_code == 202

        # When the workers are upgraded one at a time, the first of them paused with
        # events in flight (a backlog forms behind it), then killed (kill -9: its
        # messages in flight go to the next owner)
        first = old_workers[0]
        first.signal(signal.SIGSTOP)
        time.sleep(2)
        first.kill()
        stack.worker()  # (SQLite: after the one writer it replaces)
        for later in old_workers[1:]:  # (PostgreSQL) the next one stops as an upgrade does
            stack.worker()
            assert later.stop() == 0, later.log()
        stack.wait_all_owned(workers=workers, timeout_s=60)
        # Then once no 0.1.0 worker beats any more, the receiver writes version 2
        wait_until(lambda: _gauge(new_ops) == 2, 30, "the new receiver to write version 2")

        # When the 0.1.0 receiver is replaced by another of this release
        urls.remove(old_url)
        assert old_receiver.stop() == 0, old_receiver.log()
        stack.receiver()
        urls.append(stack.url)
        count = len(sender.accepted)
        wait_until(lambda: len(sender.accepted) >= count + 100, 60, "more events")
    finally:
        sender.stop()

    # Then every accepted event is applied exactly once, in order, per record
    accepted = sender.accepted
    print(f"{len(accepted)} events accepted during the upgrade")
    expected: dict[str, list[int]] = defaultdict(list)
    for n in accepted:
        expected[f"contact:{n % RECORDS}"].append(n)

    def all_applied() -> bool:
        # (a record's count of events, not the journal's size: a merge writes more than
        # one journal row for its event, so the size is reached before the last events are)
        return all(
            len(store.read(key).fields.get("seq", [])) >= len(seqs)
            for key, seqs in expected.items()
        )

    wait_until(all_applied, 120, f"{len(accepted)} events applied", on_timeout=stack.logs)
    for key, seqs in expected.items():
        record = store.read(key)
        assert record.fields["seq"] == seqs, key
        assert record.fields["visits"] == len(seqs), key
    assert not sender.refused or all(r.startswith("503") for r in sender.refused), sender.refused
    # (the mixed receivers' events: each applied once)
    wait_until(
        lambda: store.read("contact:mixed").fields.get("visits") == 2,
        60,
        "the mixed receivers' two events",
        on_timeout=stack.logs,
    )
    # And nothing else became a dead letter
    rows = store.dead_letters(DeadLetterFilter())
    assert sorted(r.reason for r in rows) == sorted(["merge_review", _dead_reason(rows)]), rows

    # And 0.1.0's events sent again are recognised as duplicates by this release
    for body in [FIRST_DAYS[0], FIRST_DAYS[2]]:
        replay = _post(stack.url, body)
        assert replay.status_code == 200, replay.text
        assert replay.headers.get("keylane-replayed") == "true"
    early = event("u-0", "contact:0", visits={"increment": 1})
    early["changes"]["seq"] = {"append": 0}
    assert _post(stack.url, early).status_code == 200
    assert store.read("contact:0").fields["visits"] == len(expected["contact:0"])

    # And its dead letter is readable and retryable, its merges readable
    listed = json.loads(stack.keylane("dlq", "list", "--json").stdout)
    dead = next(r for r in listed if r["record_key"] == "contact:dl")
    shown = stack.keylane("dlq", "show", str(dead["id"]))
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "increment" in shown.stdout
    merges = stack.keylane("merges", "list", "--json")
    assert merges.returncode == 0, merges.stderr
    assert {"person:c", "person:d"} <= set(json.dumps(json.loads(merges.stdout)).split('"'))
    absorbed = "person:b" if store.read("person:b").merged_into else "person:a"
    survivor = store.read(absorbed).merged_into
    got = stack.keylane("records", "get", absorbed, "--json")
    assert json.loads(got.stdout)["merged_into"] == survivor
    # And an event for the absorbed key, sent after the upgrade, is forwarded to the
    # survivor the merge of 0.1.0 named
    assert _post(stack.url, event("late-1", absorbed, late={"set": True})).status_code == 202
    wait_until(lambda: store.read(str(survivor)).fields.get("late") is True, 60, "forward")
    # And nothing of 0.1.0 is left running
    assert not [p.name for p in stack.procs if p.name.startswith("old-") and p.alive()]


def _dead_reason(rows: list[Any]) -> str:
    """The reason of the dead letter of contact:dl (an increment of a text field)."""
    (row,) = [r for r in rows if r.record_key == "contact:dl"]
    return str(row.reason)

"""One Redis plumbing (``routing/contract/redis_scripts.py``): every Lua script beside its
gateway follows one convention, the layouts Lua uses are the ones Python names (a drift
fails here, on a real Redis), and ``keylane audit`` reports a ``depth`` count that no longer
matches the records' lists it counts."""

from __future__ import annotations

import ast
import json
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest

from keylane.ops.audit import admitted_counts, audit_depth
from keylane.ops.embedded_redis import EmbeddedRedis
from keylane.producers import gateway
from keylane.routing import ShardMap
from keylane.routing.contract.events import Change, Event
from keylane.routing.contract.message import build_event_message
from keylane.routing.contract.redis_scripts import (
    COMMON_KEYS,
    INCLUDE,
    SHARD_KEYS,
    ScriptFolder,
    lua_constants,
)
from keylane.routing.contract.settings import Settings
from keylane.routing.redis_keys import MESSAGE_NOTES, RedisKeys, message_digest
from keylane.workers.broker import Ack, Lease, Taken, Tell
from keylane.workers.brokers import redis_calls as lane_redis
from keylane.workers.brokers.redis import RedisLaneBroker
from keylane.workers.stores.sql import SqlStore
from tests.support.stack import Stack

REPO = Path(__file__).resolve().parents[1]
#: Each script folder, and the modules that run its scripts by name.
FOLDERS = {
    gateway.SCRIPTS: (
        "producers/gateway/receiver_gateway.py",
        "producers/gateway/schedule_gateway.py",
    ),
    lane_redis.SCRIPTS: (
        "workers/brokers/redis.py",
        "workers/brokers/redis_leases.py",
        "workers/brokers/redis_notes.py",
        "workers/flow.py",
    ),
}
SHARDS = ShardMap(2)


def lua_files(folder: ScriptFolder) -> dict[str, str]:
    """Every ``.lua`` of ``folder`` (helpers too), by name."""
    files = resources.files(folder.package).joinpath(folder.folder).iterdir()
    return {f.name.removesuffix(".lua"): f.read_text() for f in files if f.name.endswith(".lua")}


def strings_in(paths: tuple[str, ...]) -> set[str]:
    """The string constants of the modules at ``paths``."""
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse((REPO / path).read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return found


@pytest.mark.parametrize("folder", list(FOLDERS), ids=lambda f: f"{f.package}/{f.folder}")
def test_every_script_beside_a_gateway_is_run_by_name_and_names_its_keys_and_args(
    folder: ScriptFolder,
) -> None:
    # Given a gateway's script folder and the modules that run its scripts
    names = strings_in(FOLDERS[folder])
    for name, text in lua_files(folder).items():
        lines = text.splitlines()
        if lines[0].startswith(INCLUDE):
            # Then a script that includes a helper includes one of its folder
            assert lines[0].removeprefix(INCLUDE).removesuffix(".lua") in lua_files(folder)
            lines = lines[1:]
        if name.startswith("_"):
            continue
        header = " ".join(line for line in _leading_comments(lines))
        body = "\n".join(line for line in lines if not line.startswith("--"))
        # And every script is run by its name
        assert name in names, f"{name}.lua is not run by {FOLDERS[folder]}"
        # And its header names the KEYS and ARGV it reads
        for word in ("KEYS", "ARGV"):
            if word in body:
                assert word in header, f"{name}.lua uses {word} without naming them at its top"
        # And it loads with what it includes
        assert folder.source(name).endswith(text)


def _leading_comments(lines: list[str]) -> Iterator[str]:
    for line in lines:
        if not line.startswith("--"):
            return
        yield line


@pytest.mark.parametrize("folder", list(FOLDERS), ids=lambda f: f"{f.package}/{f.folder}")
def test_no_script_spells_a_layout_that_python_names(folder: ScriptFolder) -> None:
    # Given every Lua file of the folder
    for name, text in lua_files(folder).items():
        code = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
        # Then no note is taken by its position, no key counted from the end of KEYS,
        # and none of the generated layouts is defined by hand
        assert not re.search(r"NOTES\[|KEYS\[#KEYS", code), name
        assert not re.search(r"local (NOTES|SHARD_KEYS|COMMON_KEYS)\b", code), name
        # And every key a lane script reads from its shard's table is one Python names
        fields = set(re.findall(r"\bK\.(\w+)", code))
        assert fields <= set(SHARD_KEYS + COMMON_KEYS), (name, fields)


def test_the_generated_layouts_are_the_python_ones() -> None:
    # Given the constants put before a lane script
    text = lane_redis.script_text("finish")
    # Then they are there, generated from the Python tuples
    assert text.startswith(lua_constants())
    for name in MESSAGE_NOTES:
        assert f"{name} = ':{name}'" in text
    assert "local SHARD_KEYS = {'" + "', '".join(SHARD_KEYS) + "'}" in text


# -- on a real Redis ---------------------------------------------------------------------


@pytest.fixture
def broker(redis_url: str, namespace: str) -> Iterator[RedisLaneBroker]:
    lane_broker = RedisLaneBroker.from_url(redis_url, RedisKeys(namespace), SHARDS)
    yield lane_broker
    lane_broker.close()


def message(record_key: str, n: int) -> bytes:
    """A real event message of ``record_key``."""
    shard = SHARDS.shard_for_key(record_key)
    event = Event(
        source="crm",
        event_id=f"{record_key}/{n}",
        event_type="update",
        record_key=record_key,
        changes={"n": Change(op="increment", value=1)},
        body_sha256="0" * 64,
        accepted_at=0.0,
        shard=shard,
    )
    return build_event_message(event, SHARDS.queue_name(shard))


def owned(broker: RedisLaneBroker, shard: int) -> Lease:
    acquired = broker.acquire(shard, "w1", 60_000)
    assert acquired.lease is not None
    return acquired.lease


def key_in(shard: int) -> str:
    """A record key of ``shard``."""
    return next(f"k{n}" for n in range(100) if SHARDS.shard_for_key(f"k{n}") == shard)


def taken(got: object) -> Taken:
    assert isinstance(got, Taken), got
    return got


def test_the_lua_side_names_each_shard_key_as_python_does(broker: RedisLaneBroker) -> None:
    # Given the keys the broker sends a lane script for shard 1, and the shared helpers
    keys = broker._shard_keys(1) + broker._common_keys()
    probe = lane_redis.script_text("take").split("\n-- include: _shared.lua\n")[0]
    fields = SHARD_KEYS + COMMON_KEYS
    probe += "\nlocal K = shard_keys(0)\nreturn {" + ", ".join(f"K.{f}" for f in fields) + "}"
    # When Lua reads its table of them by name
    replies = broker.client.eval(probe, len(keys), *keys)
    named = dict(zip(fields, [x.decode() for x in replies], strict=True))
    # Then each name is the key Python means by it
    k = broker.keys
    assert named == {
        "lease": k.lease(1),
        "queue": broker.queue_key(1),
        "rec_prefix": k.record_prefix(1),
        "ready": k.ready(1),
        "busy": k.busy(1),
        "waits": k.waits(1),
        "deliveries": k.deliveries(1),
        "depth": k.depth,
        "held": k.held,
        "counters": k.counters,
        "backlog": k.backlog,
    }


def test_a_finished_message_leaves_none_of_its_notes(broker: RedisLaneBroker) -> None:
    # Given a record's message handed to a lane, with every note Python names kept with it
    shard = SHARDS.shard_for_key("a")
    lease = owned(broker, shard)
    broker.client.lpush(broker.queue_key(shard), message("a", 1))
    got = taken(broker.take([lease]))
    deliveries = broker.keys.deliveries(shard)
    for note in MESSAGE_NOTES:
        broker.client.hset(deliveries, f"{message_digest(got.raw)}:{note}", "x")
    # When it is acknowledged
    broker.finish(lease, got, [Ack(got.raw)])
    # Then its delivery count and all its notes are forgotten
    assert broker.client.hgetall(deliveries) == {}


def test_the_helper_counts_and_tells_a_rabbitmq_ack_in_one_call_as_finish_does(
    tmp_path: Path,
) -> None:
    # Given the Redis helper of a RabbitMQ deployment (a Redis of its own, to count calls),
    # and a listener on the outcomes channel
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    helper = RedisLaneBroker.from_url(server.url, RedisKeys("ns"), SHARDS)
    try:
        k = helper.keys
        listener = helper.client.pubsub(ignore_subscribe_messages=True)
        listener.subscribe(k.outcomes)
        helper.client.script_load(lane_redis.script_text("after_ack"))
        helper.client.config_resetstat()
        first = Tell("crm", "e1", b'{"status": "applied"}', 60_000, False)
        # When two acknowledgements are counted and told after their ack, and then a
        # third tells the first event again (a duplicate's tell) with another body, and a
        # fourth replaces it (an operator's retry decided it anew)
        helper.after_ack(
            [
                Ack(b"m1", "applied", conflicts=1, attempts=2, latency_s=0.02, tell=first),
                Ack(b"m2", "dead_lettered", attempts=5, latency_s=0.5),
            ]
        )
        helper.after_ack([Ack(b"m3", "duplicate", tell=replace(first, body=b"other"))])
        helper.after_ack([Ack(b"m4", "applied", tell=replace(first, body=b"anew", replace=True))])
        helper.after_ack([Ack(b"m5")])  # nothing to count or tell: no call
        # Then the counters and the latency histogram hold what finish.lua would count
        counters = {f.decode(): int(v) for f, v in helper.client.hgetall(k.counters).items()}
        assert counters == {
            "applied": 2,
            "dead_lettered": 1,
            "duplicate": 1,
            "conflicts": 1,
            "attempts": 7,
        }
        assert int(helper.client.hget(k.latency, "count") or 0) == 2
        # And the first tell stood against the second, the replacing one did not, and each
        # was published as kept
        published: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(published) < 3 and time.monotonic() < deadline:
            heard = listener.get_message(timeout=0.5)
            if heard is not None:
                published.append(heard["data"])
        assert published == [first.body, first.body, b"anew"]
        assert helper.client.get(k.outcome("crm", "e1")) == b"anew"
        assert 0 < int(helper.client.pttl(k.outcome("crm", "e1"))) <= 60_000
        # And each acknowledgement was one script call, the fourth none
        assert helper.client.info("commandstats")["cmdstat_evalsha"]["calls"] == 3
        listener.close()
    finally:
        helper.close()
        server.stop()


def test_the_depth_count_matches_the_lists_while_records_are_due_in_flight_and_held(
    broker: RedisLaneBroker,
) -> None:
    # Given records of both shards admitted: one in flight, the rest due, one held
    leases = [owned(broker, 0), owned(broker, 1)]
    for key in ("a", "b", "c", "d"):
        for n in (1, 2):
            broker.client.lpush(broker.queue_key(SHARDS.shard_for_key(key)), message(key, n))
    first = taken(broker.take(leases))
    lease = leases[first.shard]
    broker.finish(lease, first, [Ack(first.raw)], hold=7)
    taken(broker.take(leases))
    # When the audit counts them, Then the depth hash and the lists agree on every shard
    counts = broker.admitted_counts()
    assert set(counts) == {0, 1}
    assert sum(listed for _, listed in counts.values()) == 8 - 1 - 1  # one acked, one held
    assert audit_depth(counts) == []


def test_audit_reports_a_depth_count_that_drifted_from_the_lists(
    broker: RedisLaneBroker,
) -> None:
    # Given two shards with admitted messages, counted right
    leases = [owned(broker, 0), owned(broker, 1)]
    a, b = 0, 1
    for shard in (a, b):
        broker.client.lpush(broker.queue_key(shard), message(key_in(shard), 1))
    taken(broker.take(leases))
    taken(broker.take(leases))
    assert audit_depth(broker.admitted_counts()) == []
    # When one shard's count misses a decrement, and a message lands in the other's list
    # without being counted
    broker.client.hincrby(broker.keys.depth, str(a), 1)
    broker.client.rpush(broker.keys.record(b, key_in(b)), message(key_in(b), 2))
    # Then the audit names both shards, with both figures, and nothing was repaired
    drifted = {a: (2, 1), b: (1, 2)}
    assert audit_depth(broker.admitted_counts()) == [
        f"shard {s}: the depth hash counts {counted} admitted messages, "
        f"its records' lists hold {listed}"
        for s, (counted, listed) in sorted(drifted.items())
    ]
    assert broker.admitted_counts()[a] == (2, 1)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_keylane_audit_fails_on_a_drifted_depth_count(
    settings: Settings, stack: Stack, store: SqlStore
) -> None:
    # Given a deployment (a migrated store) whose shard 3 has one message in a record's
    # list, counted
    broker = RedisLaneBroker.from_url(settings.redis_dsn(), settings.keys, settings.shards)
    try:
        shard = 3
        broker.client.rpush(broker.keys.record(shard, "k"), b"m")
        broker.client.zadd(broker.keys.ready(shard), {"k": 0})
        broker.client.hincrby(broker.keys.depth, str(shard), 1)
        clean = stack.keylane("audit", "--json")
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert admitted_counts(settings)[shard] == (1, 1)
        # When the count drifts (a decrement lost)
        broker.client.hincrby(broker.keys.depth, str(shard), 1)
    finally:
        broker.close()
    # Then keylane audit exits 1 and names the shard and both figures
    drifted = stack.keylane("audit", "--json")
    assert drifted.returncode == 1, drifted.stdout + drifted.stderr
    assert json.loads(drifted.stdout)["depth_problems"] == [
        "shard 3: the depth hash counts 2 admitted messages, its records' lists hold 1"
    ]

"""Fixtures that give tests real services, started when absent, and never touch data
the tests did not create.

* Redis: ``KEYLANE_TEST_REDIS_URL``, else 127.0.0.1:6379, else a ``redis-server`` started
  on a free port for the session. Each test gets its own key namespace, deleted after it.
* PostgreSQL: ``KEYLANE_TEST_PG_URL``, else 127.0.0.1:5432 database ``test``, else a
  cluster created with ``initdb`` in a temporary directory. Each test gets its own schema,
  dropped after it.
* RabbitMQ: a 3-node cluster of the session's own on free loopback ports (never the
  system's node on 5672), started when a test first asks for it; skipped only when
  ``rabbitmq-server`` is not installed. Tests that kill a node get it back afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from kombu import Connection

from keylane.ops.embedded_redis import EmbeddedRedis
from keylane.routing.contract.amqp_names import dead_queue, probe_queue, shard_queue
from keylane.routing.contract.settings import Settings
from keylane.routing.contract.settings_env import load_settings
from keylane.workers.stores import open_store
from keylane.workers.stores.sql import SqlStore
from tests.support.rabbitmq import RabbitCluster, find_rabbitmq_sbin, rabbit_settings
from tests.support.services import (
    EmbeddedPostgres,
    pg_reachable,
    redis_reachable,
    start_session_redis,
)
from tests.support.stack import Stack

STORE_KINDS = ["sqlite", "postgres"]

# Hypothesis fails an example that runs past 200 ms by default, and a test whose data
# takes long to generate (its too_slow health check): timings, which a busy machine breaks
# (354 ms seen under a full suite). Examples are judged by what they assert.
hypothesis_settings.register_profile(
    "keylane", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile("keylane")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """How `pytest -n N --dist loadgroup` (pyproject.toml) shares the tests among its
    processes: each test goes to whichever process is free, except that the tests using
    the RabbitMQ cluster all go to one process (one 3-node cluster for the run), and the
    tests of a module with a fixture wider than a test (a deployment or a venv built once
    per module) go to one process together (built once)."""
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        if fixtures is None:
            continue
        if "rabbitmq_cluster" in fixtures.names_closure:
            item.add_marker(pytest.mark.xdist_group("rabbitmq"))
            continue
        scopes = {
            definition.scope
            for definitions in fixtures.name2fixturedefs.values()
            for definition in definitions
        }
        if scopes & {"module", "package", "class"}:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis server URL (an existing one, or one started for the session)."""
    for url in (os.environ.get("KEYLANE_TEST_REDIS_URL"), "redis://127.0.0.1:6379/0"):
        if url and redis_reachable(url):
            yield url
            return
    server = start_session_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A PostgreSQL URL (an existing server, or a cluster created for the session)."""
    for url in (os.environ.get("KEYLANE_TEST_PG_URL"), "postgresql://postgres@127.0.0.1:5432/test"):
        if url and pg_reachable(url):
            yield url
            return
    cluster = EmbeddedPostgres(tmp_path_factory.mktemp("pg"))
    if not cluster.available():
        pytest.skip("no PostgreSQL reachable and no initdb to create one")
    cluster.start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def rabbitmq_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitCluster]:
    """A 3-node RabbitMQ cluster for the session (one per xdist process that needs it)."""
    sbin = find_rabbitmq_sbin()
    if sbin is None:
        pytest.skip(
            "rabbitmq-server is not installed (looked in KEYLANE_TEST_RABBITMQ_SBIN, "
            "/usr/lib/rabbitmq/bin and PATH); the RabbitMQ cluster tests need it"
        )
    cluster = RabbitCluster(tmp_path_factory.mktemp("rabbitmq"), sbin)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        print(f"\nRabbitMQ test cluster, seconds: {cluster.timings}")


@pytest.fixture
def rabbitmq(rabbitmq_cluster: RabbitCluster) -> Iterator[RabbitCluster]:
    """The session's RabbitMQ cluster with every node running; a node the test killed
    is restarted after it."""
    rabbitmq_cluster.heal()
    yield rabbitmq_cluster
    rabbitmq_cluster.heal()


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    """A Redis key namespace private to this test; its keys are deleted afterwards."""
    ns = f"kltest-{uuid.uuid4().hex[:10]}"
    yield ns
    delete_namespace(redis_url, ns)


def delete_namespace(redis_url: str, ns: str) -> None:
    """Delete every key of a test namespace (and nothing else)."""
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{ns}:*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])
    client.close()


def fast_settings(redis_url: str, namespace: str, store_url: str, data_dir: Path) -> Settings:
    """Settings for a test deployment: private namespace and store, fast timings."""
    return load_settings(
        data_dir=data_dir,
        redis_url=redis_url,
        store_url=store_url,
        namespace=namespace,
        lease_ttl_ms=3000,
        heartbeat_ms=500,
        idle_poll_ms=50,
        counts_flush_ms=100,
    )


def _pg_schema_url(base: str, schema: str) -> str:
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}"


@pytest.fixture(params=STORE_KINDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty store of each kind: a SQLite file, or a PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.sqlite3'}"
        return
    import psycopg

    base: str = request.getfixturevalue("pg_url")
    schema = f"kltest_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield _pg_schema_url(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    """An open, migrated store."""
    s = open_store(store_url)
    s.migrate()
    yield s
    s.close()


@pytest.fixture
def settings(redis_url: str, namespace: str, store_url: str, tmp_path: Path) -> Settings:
    """Settings for a test deployment: private namespace and store, fast timings."""
    return fast_settings(redis_url, namespace, store_url, tmp_path / "data")


@pytest.fixture
def stack(settings: Settings, tmp_path: Path) -> Iterator[Stack]:
    """A deployment of real processes on the test's namespace and store; every process
    it starts is stopped when the test ends."""
    deployment = Stack(settings, tmp_path)
    yield deployment
    deployment.stop_all()


@pytest.fixture
def pg_store_url(pg_url: str) -> Iterator[str]:
    """A fresh PostgreSQL schema (RabbitMQ deployments run on PostgreSQL)."""
    schema = f"kltest_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in pg_url else "?"
    try:
        yield f"{pg_url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def deploy(
    rabbitmq: RabbitCluster, redis_url: str, namespace: str, pg_store_url: str, tmp_path: Path
) -> Iterator[Any]:
    """Build a deployment on the cluster (``deploy(**settings)``); its processes are
    stopped and its queues deleted after the test."""
    stacks: list[Stack] = []

    def build(**more: Any) -> Stack:
        helper = more.pop("redis_url", redis_url)
        s = rabbit_settings(rabbitmq, helper, namespace, pg_store_url, tmp_path / "d", **more)
        stack = Stack(s, tmp_path)
        stacks.append(stack)
        return stack

    yield build
    for stack in stacks:
        stack.stop_all()
    rabbitmq.heal()
    for stack in stacks:
        _delete_queues(rabbitmq, stack.settings)


def _delete_queues(cluster: RabbitCluster, s: Settings) -> None:
    with Connection(cluster.nodes[0].url) as conn:
        channel = conn.channel()
        for shard in range(s.shard_count):
            channel.queue_delete(shard_queue(s.namespace, s.shards, shard))
        channel.queue_delete(dead_queue(s.namespace))
        channel.queue_delete(probe_queue(s.namespace))
        channel.exchange_delete(dead_queue(s.namespace))


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A Redis server of the test's own (its INFO counts only what the test runs)."""
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()

"""docker-compose.yml and the Dockerfile, checked without Docker: the compose file parses,
every keylane service runs a real ``keylane`` subcommand with options it accepts, Redis is
durable, workers can be scaled and share the data volume, and the worker's healthcheck
tells a live member from an absent one against a real Redis."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keylane.routing.contract.settings_env import load_settings
from keylane.workers.brokers.redis import RedisLaneBroker
from tests.support.stack import REPO

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to parse docker-compose.yml")

COMPOSE = REPO / "docker-compose.yml"
KEYLANE_SERVICES = ("receiver", "worker", "flower")
RABBITMQ_NODES = ("rabbitmq-1", "rabbitmq-2", "rabbitmq-3")
RABBITMQ = (*RABBITMQ_NODES, "receiver-rabbitmq", "worker-rabbitmq")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """docker-compose.yml as parsed by a YAML parser (anchors and merge keys resolved)."""
    parsed = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(parsed, dict)
    return parsed


def _service(compose: dict[str, Any], name: str) -> dict[str, Any]:
    service = compose["services"][name]
    assert isinstance(service, dict)
    return service


def _keylane_cli() -> list[str]:
    script = Path(sys.executable).parent / "keylane"
    return [str(script)] if script.exists() else [sys.executable, "-m", "keylane.ops.cli"]


def _python_snippet(healthcheck: dict[str, Any]) -> str:
    test = healthcheck["test"]
    assert test[:3] == ["CMD", "python", "-c"], test
    snippet = test[3]
    assert isinstance(snippet, str)
    return snippet


def test_the_compose_file_has_the_expected_services(compose: dict[str, Any]) -> None:
    # Given the parsed compose file
    services = compose["services"]
    # Then it runs Redis, the receiver, workers and Flower, and PostgreSQL only on request
    assert set(services) == {"redis", "receiver", "worker", "flower", "postgres", *RABBITMQ}
    assert services["postgres"]["profiles"] == ["postgres", "rabbitmq"]
    for name in ("redis", *KEYLANE_SERVICES):
        assert "profiles" not in services[name], name


@pytest.mark.parametrize("name", KEYLANE_SERVICES)
def test_each_keylane_service_runs_a_real_subcommand(compose: dict[str, Any], name: str) -> None:
    # Given a keylane service's command
    command = _service(compose, name)["command"]
    assert command[0] == "keylane", command
    # When the CLI parses exactly those arguments (plus --help, which stops before running)
    result = subprocess.run(
        [*_keylane_cli(), *command[1:], "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    # Then the subcommand exists and accepts every option given
    assert result.returncode == 0, result.stderr
    assert f"Usage: keylane {command[1]}" in result.stdout


def test_keylane_services_share_one_image_and_configuration(compose: dict[str, Any]) -> None:
    for name in KEYLANE_SERVICES:
        service = _service(compose, name)
        # Then each is built from the Dockerfile into one image, runs under an init process
        assert service["build"] == ".", name
        assert service["image"] == "keylane:local", name
        assert service["init"] is True, name
        env = service["environment"]
        # And reaches Redis by its service name, keeps data in /data
        assert env["KEYLANE_REDIS_URL"] == "redis://redis:6379/0", name
        assert env["KEYLANE_DATA_DIR"] == "/data", name
        # And passes SENTRY_DSN and the store URL through only when set (null: unset)
        for passthrough in ("SENTRY_DSN", "KEYLANE_STORE_URL"):
            assert passthrough in env, name
            assert env[passthrough] is None, name
        # And starts only once Redis is healthy
        assert service["depends_on"]["redis"]["condition"] == "service_healthy", name


def test_redis_is_durable_and_checked(compose: dict[str, Any]) -> None:
    redis_service = _service(compose, "redis")
    command = " ".join(redis_service["command"])
    # Then a 202 means the event is on disk (README, "The guarantees")
    assert "--appendonly yes" in command
    assert "--appendfsync always" in command
    assert redis_service["image"].startswith("redis:7")
    assert any(v.endswith(":/data") for v in redis_service["volumes"])
    assert redis_service["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "redis-data" in compose["volumes"]


def test_workers_scale_and_share_the_data_volume(compose: dict[str, Any]) -> None:
    worker = _service(compose, "worker")
    # Then nothing pins a worker to one container: no name, no published port
    assert "container_name" not in worker
    assert "ports" not in worker
    assert worker["deploy"]["replicas"] >= 1
    # And every replica mounts the same named volume on the data directory (SQLite store)
    assert "keylane-data:/data" in worker["volumes"]
    assert "keylane-data" in compose["volumes"]
    # And PostgreSQL is waited for only when its profile is active
    postgres = worker["depends_on"]["postgres"]
    assert postgres == {"condition": "service_healthy", "required": False}
    # And there is time to finish in-flight events on stop
    assert worker["stop_grace_period"].endswith("s")
    assert int(worker["stop_grace_period"][:-1]) >= 30


def test_http_healthchecks_probe_the_ports_the_services_listen_on(
    compose: dict[str, Any],
) -> None:
    for name, path in (("receiver", "/readyz"), ("flower", "/healthcheck")):
        service = _service(compose, name)
        command = service["command"]
        port = command[command.index("--port") + 1]
        snippet = _python_snippet(service["healthcheck"])
        compile(snippet, f"{name}-healthcheck", "exec")
        assert f"http://127.0.0.1:{port}{path}" in snippet, name
        # the container port is published (a host port range maps replicas to it)
        assert any(str(p).endswith(f":{port}") for p in service["ports"]), name


def _run_healthcheck(snippet: str, redis_url: str, namespace: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYLANE_")}
    env.update(
        KEYLANE_REDIS_URL=redis_url,
        KEYLANE_NAMESPACE=namespace,
        # A beat counts for a lease's time from when it was written: ten minutes here, not
        # 10 s, which a new Python process on a busy machine can take to start.
        KEYLANE_LEASE_TTL_MS="600000",
        PYTHONPATH=str(REPO),
    )
    result = subprocess.run(
        [sys.executable, "-c", snippet], env=env, capture_output=True, text=True, timeout=60
    )
    return result.returncode


def test_the_worker_healthcheck_needs_a_live_member_of_this_host(
    compose: dict[str, Any], redis_url: str, namespace: str
) -> None:
    # Given the worker's healthcheck and an empty namespace
    snippet = _python_snippet(_service(compose, "worker")["healthcheck"])
    compile(snippet, "worker-healthcheck", "exec")
    settings = load_settings(redis_url=redis_url, namespace=namespace)
    broker = RedisLaneBroker.from_url(redis_url, settings.keys, settings.shards)
    # When no worker of this host is a member, Then it fails
    assert _run_healthcheck(snippet, redis_url, namespace) == 1
    # When a worker of another host heartbeats, Then it still fails. (Members live ten
    # minutes here, not a lease's 10 s: the check is a new Python process, which a busy
    # machine can take longer than that to start.)
    alive_ms = 600_000
    broker.heartbeat("elsewhere:1:abcdef", {}, member_ttl_ms=alive_ms)
    assert _run_healthcheck(snippet, redis_url, namespace) == 1
    # When a worker of this host heartbeats (ids are "<hostname>:<pid>:<random>"), Then it passes
    broker.heartbeat(f"{socket.gethostname()}:7:abcdef", {}, member_ttl_ms=alive_ms)
    assert _run_healthcheck(snippet, redis_url, namespace) == 0


def test_the_dockerfile_installs_the_project_as_a_non_root_user() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    instructions = [
        line.split(None, 1)
        for line in dockerfile.splitlines()
        if line.strip() and not line.startswith((" ", "#"))
    ]
    # Then it starts from python:3.11-slim and installs from pyproject.toml with pip
    assert instructions[0] == ["FROM", "python:3.11-slim"]
    assert re.search(r"COPY pyproject\.toml .*/tmp/src/", dockerfile)
    assert "pip install /tmp/src" in dockerfile
    # And the last USER is not root
    users = [rest.strip() for op, rest in instructions if op == "USER"]
    assert users
    assert users[-1] not in ("root", "0")
    # And every path it copies exists and is not excluded by .dockerignore
    ignored = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for op, rest in instructions:
        if op != "COPY":
            continue
        for source in rest.split()[:-1]:
            if "[" in source:
                continue  # optional file (glob)
            assert (REPO / source).exists(), source
            assert source not in ignored, source


def test_the_rabbitmq_profile_has_no_single_point_of_failure(compose: dict[str, Any]) -> None:
    # Given the services of the rabbitmq profile
    for name in RABBITMQ:
        assert _service(compose, name)["profiles"] == ["rabbitmq"], name
    # Then three RabbitMQ nodes form one cluster by name, each with its own data volume
    conf = compose["configs"]["rabbitmq-conf"]["content"]
    for number, node in enumerate(RABBITMQ_NODES, start=1):
        assert f"classic_config.nodes.{number} = rabbit@{node}" in conf
        assert f"{node}-data:/var/lib/rabbitmq" in _service(compose, node)["volumes"]
    assert "consumer_timeout = " in conf
    # And the receiver and workers reach every node and PostgreSQL, and wait for them
    for name in ("receiver-rabbitmq", "worker-rabbitmq"):
        service = _service(compose, name)
        env = service["environment"]
        settings = load_settings(
            broker_url=env["KEYLANE_BROKER_URL"], store_url=env["KEYLANE_STORE_URL"]
        )
        hosts = [url.split("@")[1].split(":")[0] for url in settings.amqp_urls()]
        assert hosts == list(RABBITMQ_NODES), name
        assert not settings.store_is_sqlite
        for needed in (*RABBITMQ_NODES, "postgres"):
            assert service["depends_on"][needed]["condition"] == "service_healthy", name
    # And the command of each is a real keylane command
    assert _service(compose, "worker-rabbitmq")["command"] == ["keylane", "worker"]
    assert _service(compose, "receiver-rabbitmq")["command"][:2] == ["keylane", "serve"]


@pytest.mark.parametrize("name", ["receiver", "receiver-rabbitmq"])
def test_metrics_listen_on_the_compose_network_only(compose: dict[str, Any], name: str) -> None:
    service = _service(compose, name)
    command = service["command"]
    # Given a receiver: its operations listener is on a port of its own ...
    ops_port = command[command.index("--ops-port") + 1]
    assert ops_port != command[command.index("--port") + 1]
    assert command[command.index("--ops-host") + 1] == "0.0.0.0"
    # ... reachable from the compose network (where Prometheus scrapes it), never published
    assert service["expose"] == [ops_port]
    assert not any(str(p).endswith(f":{ops_port}") for p in service["ports"])


def test_flower_on_every_address_takes_its_password_from_the_environment(
    compose: dict[str, Any],
) -> None:
    flower = _service(compose, "flower")
    command = flower["command"]
    assert command[command.index("--address") + 1] == "0.0.0.0"
    # Then its password comes from the shell (null: passed through), and the file says so
    assert "KEYLANE_FLOWER_BASIC_AUTH" in flower["environment"]
    assert flower["environment"]["KEYLANE_FLOWER_BASIC_AUTH"] is None
    text = COMPOSE.read_text()
    assert "refuses to start without a password" in text
    assert "export KEYLANE_FLOWER_BASIC_AUTH=" in text

"""A RabbitMQ cluster of the tests' own: N nodes (3 by default) on free loopback ports,
started in parallel, clustered as they boot, torn down after.

It never touches the system's node (``rabbit@localhost`` on 5672) or its data:

* its own ``epmd`` on a free port (``ERL_EPMD_PORT``), so its node names never meet the
  system's, and it is stopped with the cluster;
* its own ``HOME`` holding the Erlang cookie that the nodes and ``rabbitmqctl`` share.
  RabbitMQ 3.10 reads ``$HOME/.erlang.cookie``; it also honours ``RABBITMQ_ERLANG_COOKIE``
  (the server logs "Overriding Erlang cookie", the CLI calls it deprecated), so the file
  it is;
* its own config, env, advanced-config and enabled-plugins files (never /etc/rabbitmq's),
  ``RABBITMQ_MNESIA_BASE`` and ``RABBITMQ_LOG_BASE`` in the cluster's temporary directory;
* each node in its own process group: the ``rabbitmq-server`` script stays the parent of
  ``beam.smp`` (which has helper children), so ``kill -9`` goes to the whole group.

Debian's ``/usr/sbin/rabbitmq-server`` is a wrapper that switches to the ``rabbitmq`` user
and its home, dropping the environment; the real scripts are in ``/usr/lib/rabbitmq/bin``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keylane.routing.contract.settings import Settings
from keylane.routing.contract.settings_env import load_settings
from tests.support.services import free_port

#: Where the real scripts live when PATH only has wrappers (Debian, Ubuntu).
SBIN_CANDIDATES = ("/usr/lib/rabbitmq/bin", "/usr/local/sbin", "/opt/homebrew/sbin")
BOOT_TIMEOUT_S = 240.0  # generous: a loaded 2-core machine took 70 s
CLI_TIMEOUT_S = 120.0


def find_rabbitmq_sbin() -> Path | None:
    """The directory holding the real ``rabbitmq-server`` and ``rabbitmqctl`` scripts
    (``KEYLANE_TEST_RABBITMQ_SBIN`` if set), or None when RabbitMQ is not installed."""
    explicit = os.environ.get("KEYLANE_TEST_RABBITMQ_SBIN")
    candidates = [explicit] if explicit else [*SBIN_CANDIDATES]
    on_path = shutil.which("rabbitmq-server") or shutil.which("rabbitmq-server", path="/usr/sbin")
    if on_path and not explicit:
        candidates.append(str(Path(on_path).parent))
    for candidate in candidates:
        folder = Path(candidate)
        if (folder / "rabbitmq-server").is_file() and (folder / "rabbitmqctl").is_file():
            return folder
    return None


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for(
    condition: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.1
) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


@dataclass
class RabbitNode:
    """One node of a test cluster: its name, ports, files and process."""

    name: str
    amqp_port: int
    dist_port: int
    base: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The node's AMQP URL (guest/guest, vhost ``/``)."""
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}//"

    @property
    def log_path(self) -> Path:
        """The node's own log file (RabbitMQ writes it under ``RABBITMQ_LOG_BASE``)."""
        return self.base / "log" / f"{self.name}.log"

    def alive(self) -> bool:
        """Whether the node's process is running."""
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        """The end of the node's console output and log, for error messages."""
        parts = []
        for path in (self.base / "console.log", self.log_path):
            if path.exists():
                parts.append(f"--- {path}\n" + "\n".join(path.read_text().splitlines()[-lines:]))
        return "\n".join(parts)


class RabbitCluster:
    """A RabbitMQ cluster started for the tests; ``start()``, then ``urls``, ``kill``,
    ``restart``, ``ctl``; ``stop()`` kills its processes and deletes its files."""

    def __init__(self, directory: Path, sbin: Path, size: int = 3, node_config: str = "") -> None:
        self.dir = directory
        self.sbin = sbin
        self.home = directory / "home"
        self.epmd_port = free_port()
        self.node_config = node_config
        self.epmd: subprocess.Popen[bytes] | None = None
        prefix = f"kl{uuid.uuid4().hex[:6]}"
        self.nodes = [
            RabbitNode(
                name=f"{prefix}-{i}@localhost",
                amqp_port=free_port(),
                dist_port=free_port(),
                base=directory / f"node{i}",
            )
            for i in range(1, size + 1)
        ]
        self.timings: dict[str, float] = {}

    # -- environment -------------------------------------------------------------

    def _base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env["HOME"] = str(self.home)
        env["ERL_EPMD_PORT"] = str(self.epmd_port)
        # Never an epmd daemon of their own: a node or rabbitmqctl started while the
        # cluster's epmd is gone would start one that outlives the cluster. Fail instead.
        env["ERL_FLAGS"] = "-start_epmd false"
        env["RABBITMQ_CONF_ENV_FILE"] = str(self.dir / "rabbitmq-env.conf")
        return env

    def _node_env(self, node: RabbitNode) -> dict[str, str]:
        env = self._base_env()
        env.update(
            RABBITMQ_NODENAME=node.name,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(node.amqp_port),
            RABBITMQ_DIST_PORT=str(node.dist_port),
            RABBITMQ_MNESIA_BASE=str(node.base / "mnesia"),
            RABBITMQ_LOG_BASE=str(node.base / "log"),
            RABBITMQ_CONFIG_FILE=str(node.base / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(node.base / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(node.base / "enabled_plugins"),
            RABBITMQ_PLUGINS_EXPAND_DIR=str(node.base / "plugins-expand"),
            # inter-node traffic on loopback only, as the system's node does
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
        )
        return env

    def _write_files(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text(uuid.uuid4().hex.upper())
        cookie.chmod(0o400)
        (self.dir / "rabbitmq-env.conf").write_text("# the test cluster's own: empty\n")
        for node in self.nodes:
            (node.base / "log").mkdir(parents=True, exist_ok=True)
            (node.base / "mnesia").mkdir(exist_ok=True)
            (node.base / "enabled_plugins").write_text("[].\n")
            (node.base / "advanced.config").write_text("[].\n")
            (node.base / "rabbitmq.conf").write_text(
                f"listeners.tcp.1 = 127.0.0.1:{node.amqp_port}\n"
                # a busy, nearly full test disk must not block publishers
                "disk_free_limit.absolute = 10MB\n"
                "log.console = false\n"
                f"{self._formation(node)}"
                f"{self.node_config}\n"
            )

    def _formation(self, node: RabbitNode) -> str:
        # The other nodes join the first as they boot (peer discovery from the config):
        # no stop_app / join_cluster / start_app cycle, which took 20 to 35 s more on a
        # loaded machine. They start once the first runs: one joining while the first
        # still boots can crash it (incompatible_feature_flags, "replicas ... not active").
        first = self.nodes[0]
        if node is first:
            return ""
        return (
            "cluster_formation.peer_discovery_backend = classic_config\n"
            f"cluster_formation.classic_config.nodes.1 = {first.name}\n"
            "cluster_formation.discovery_retry_limit = 240\n"
            "cluster_formation.discovery_retry_interval = 500\n"
        )

    # -- processes ---------------------------------------------------------------

    def _start_epmd(self) -> None:
        epmd = shutil.which("epmd") or shutil.which("epmd", path="/usr/lib/erlang/bin")
        if epmd is None:
            raise RuntimeError("epmd not found (it comes with Erlang, next to erl)")
        self.epmd = subprocess.Popen(
            [epmd, "-port", str(self.epmd_port), "-address", "127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for(lambda: _port_open(self.epmd_port), 30, "the cluster's epmd")

    def _spawn(self, node: RabbitNode) -> None:
        with (node.base / "console.log").open("ab") as console:
            node.process = subprocess.Popen(
                [str(self.sbin / "rabbitmq-server")],
                env=self._node_env(node),
                cwd=node.base,
                stdout=console,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _wait_booted(self, node: RabbitNode) -> None:
        def listening() -> bool:
            if not node.alive():
                raise RuntimeError(f"RabbitMQ node {node.name} exited\n{node.log_tail()}")
            return _port_open(node.amqp_port)

        wait_for(listening, BOOT_TIMEOUT_S, f"node {node.name} to accept AMQP")

    def start(self) -> None:
        """Start every node at once (they cluster as they boot) and wait until the
        cluster reports all of them running."""
        began = time.monotonic()
        self._write_files()
        self._start_epmd()
        first, others = self.nodes[0], self.nodes[1:]
        self._spawn(first)
        self._wait_booted(first)
        self.timings["first_s"] = time.monotonic() - began
        for node in others:
            self._spawn(node)
        for node in others:
            self._wait_booted(node)
        self.timings["boot_s"] = time.monotonic() - began
        self.wait_running()
        self.timings["start_s"] = time.monotonic() - began

    def stop(self) -> None:
        """Kill every process of the cluster (nodes, then epmd) and delete its files."""
        began = time.monotonic()
        for node in self.nodes:
            self._kill_group(node)
        if self.epmd is not None and self.epmd.poll() is None:
            os.killpg(self.epmd.pid, signal.SIGKILL)
            self.epmd.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.timings["stop_s"] = time.monotonic() - began

    @staticmethod
    def _kill_group(node: RabbitNode) -> None:
        if node.process is None or node.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.process.pid, signal.SIGKILL)
        node.process.wait(timeout=30)

    # -- crash and recovery --------------------------------------------------------

    def node(self, name: str) -> RabbitNode:
        """The node called ``name`` (``x@localhost``)."""
        return next(n for n in self.nodes if n.name == name)

    def kill(self, node: RabbitNode) -> None:
        """``kill -9`` the node (its beam and helpers) and wait until it is gone."""
        self._kill_group(node)

    def restart(self, node: RabbitNode) -> None:
        """Start a killed node again on its ports and data; wait until the cluster
        runs all its nodes."""
        if node.alive():
            raise RuntimeError(f"{node.name} is still running")
        self._spawn(node)
        self._wait_booted(node)
        self.wait_running(only=[node])

    def heal(self) -> None:
        """Restart every node that is down (what a test that killed one leaves)."""
        down = [n for n in self.nodes if not n.alive()]
        for node in down:
            self._spawn(node)
        for node in down:
            self._wait_booted(node)
        if down:
            self.wait_running()

    # -- looking at it ---------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        """Every node's AMQP URL, first node first."""
        return [n.url for n in self.nodes]

    @property
    def url(self) -> str:
        """All nodes in one URL, kombu's failover form (``amqp://a;amqp://b``)."""
        return ";".join(self.urls)

    def ctl(self, *args: str, node: RabbitNode | None = None, tool: str = "rabbitmqctl") -> str:
        """Run a RabbitMQ CLI tool against a node (the first running one by default)
        and return its output; raise with the output if it fails."""
        target = node or next(n for n in self.nodes if n.alive())
        result = subprocess.run(
            [str(self.sbin / tool), "-n", target.name, *args],
            env=self._base_env(),
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{tool} {' '.join(args)} on {target.name} failed ({result.returncode}):\n"
                f"{result.stdout}\n{result.stderr}"
            )
        return result.stdout

    def ctl_json(self, *args: str, node: RabbitNode | None = None) -> object:
        """``ctl`` with ``--formatter json``, parsed."""
        return json.loads(self.ctl(*args, "--formatter", "json", node=node))

    def running_nodes(self) -> set[str]:
        """The nodes the cluster reports running (asked of a live node)."""
        status = self.ctl_json("cluster_status")
        assert isinstance(status, dict)
        return set(status["running_nodes"])

    def wait_running(
        self, only: list[RabbitNode] | None = None, timeout_s: float = BOOT_TIMEOUT_S
    ) -> None:
        """Wait until the cluster reports every node (or ``only`` these) running and
        each of them accepts AMQP."""
        nodes = only or self.nodes
        want = {n.name for n in nodes}

        def all_running() -> bool:
            try:
                return want <= self.running_nodes()
            except (RuntimeError, subprocess.TimeoutExpired):
                return False  # the node asked is still booting

        # each check starts a CLI VM: poll gently
        wait_for(all_running, timeout_s, f"running nodes {sorted(want)}", interval_s=1.0)
        for node in nodes:
            wait_for(lambda n=node: _port_open(n.amqp_port), timeout_s, f"{node.name} AMQP")

    def queue_info(self, queue: str, vhost: str = "/") -> dict[str, object]:
        """``list_queues`` columns of one queue: arguments, type, leader, members, online,
        messages (ready, unacknowledged)."""
        rows = self.ctl_json(
            "list_queues",
            "-p",
            vhost,
            "name",
            "arguments",
            "type",
            "leader",
            "members",
            "online",
            "messages",
            "messages_ready",
            "messages_unacknowledged",
        )
        assert isinstance(rows, list)
        for row in rows:
            if row["name"] == queue:
                return dict(row)
        raise KeyError(queue)

    def leader_of(self, queue: str, vhost: str = "/") -> RabbitNode:
        """The node that leads a quorum queue now."""
        return self.node(str(self.queue_info(queue, vhost)["leader"]))

    def version(self) -> str:
        """The RabbitMQ version the nodes run."""
        status = self.ctl_json("status")
        assert isinstance(status, dict)
        return str(status["rabbitmq_version"])


def measure() -> dict[str, float]:
    """Start a cluster, kill -9 and restart its second node, stop it: the seconds each
    step took (``ops/dev python -m tests.support.rabbitmq`` prints them)."""
    sbin = find_rabbitmq_sbin()
    if sbin is None:
        raise SystemExit("rabbitmq-server is not installed")
    with tempfile.TemporaryDirectory(prefix="kl-rabbitmq-") as tmp:
        cluster = RabbitCluster(Path(tmp) / "cluster", sbin)
        try:
            cluster.start()
            began = time.monotonic()
            cluster.kill(cluster.nodes[1])
            cluster.restart(cluster.nodes[1])
            cluster.timings["kill_restart_s"] = time.monotonic() - began
        finally:
            cluster.stop()
    return {"load_1m": os.getloadavg()[0], **cluster.timings}


if __name__ == "__main__":
    print(json.dumps({k: round(v, 2) for k, v in measure().items()}))


def rabbit_settings(
    cluster: RabbitCluster, redis_url: str, namespace: str, store_url: str, data: Path, **more: Any
) -> Settings:
    """Settings of a test deployment on the cluster: the broker URL in its several-host
    form, short AMQP heartbeats (a paused worker loses its shards in seconds)."""
    hosts = ",".join(f"127.0.0.1:{node.amqp_port}" for node in cluster.nodes)
    options: dict[str, Any] = {
        "data_dir": data,
        "redis_url": redis_url,
        "store_url": store_url,
        "namespace": namespace,
        "broker_url": f"amqp://guest:guest@{hosts}//",
        "shard_count": 8,
        "lease_ttl_ms": 3000,
        "heartbeat_ms": 500,
        "idle_poll_ms": 50,
        "amqp_heartbeat_s": 2,
        "amqp_confirm_timeout_ms": 3000,
        **more,
    }
    return load_settings(**options)

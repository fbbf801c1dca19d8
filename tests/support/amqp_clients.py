"""Small kombu clients for the RabbitMQ tests: quorum queues, a publisher with publisher
confirms, consumers that record what they receive (in this process, or in a process of
their own that a test can ``kill -9``).

Run as ``python -m tests.support.amqp_clients URL QUEUE PREFETCH HEARTBEAT_S``: a consumer
that never acknowledges and prints one JSON line per delivery.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.message import Message

from tests.support.rabbitmq import RabbitCluster, RabbitNode

REPO = Path(__file__).resolve().parents[2]
DEFAULT_EXCHANGE = Exchange("")


def unique_name(prefix: str) -> str:
    """A queue name no other test uses."""
    return f"kltest-{prefix}-{uuid.uuid4().hex[:8]}"


def quorum_queue(name: str, **arguments: Any) -> Queue:
    """A durable quorum queue on the default exchange; ``arguments`` are queue arguments
    (``x-single-active-consumer=True`` is spelled ``**{"x-single-active-consumer": True}``)."""
    return Queue(
        name,
        DEFAULT_EXCHANGE,
        routing_key=name,
        durable=True,
        queue_arguments={"x-queue-type": "quorum", **arguments},
    )


def declare(url: str, queue: Queue) -> None:
    """Declare ``queue`` through the node at ``url`` (its leader is placed there)."""
    with Connection(url) as conn:
        queue(conn.channel()).declare()


class Publisher:
    """Publishes through one connection with publisher confirms on."""

    def __init__(self, url: str) -> None:
        self.connection = Connection(url, transport_options={"confirm_publish": True})
        self.channel = self.connection.channel()
        self.producer = Producer(self.channel, exchange=DEFAULT_EXCHANGE)

    def publish(self, queue: str, body: Any, confirm_timeout: float | None = 10.0) -> None:
        """Publish ``body`` to ``queue``; return once the broker confirmed it."""
        self.producer.publish(body, routing_key=queue, confirm_timeout=confirm_timeout)

    def close(self) -> None:
        """Close the connection (ignoring a dead one)."""
        with contextlib.suppress(Exception):
            self.connection.close()


@dataclass
class Delivery:
    """One message as a consumer received it."""

    body: Any
    message: Message
    at: float = field(default_factory=time.monotonic)

    @property
    def delivery_count(self) -> int:
        """``x-delivery-count`` (absent on a first delivery: 0)."""
        return int((self.message.headers or {}).get("x-delivery-count", 0))


class Inbox:
    """A consumer of one queue that records its deliveries and then, by ``action``,
    holds them unacknowledged (``"hold"``), acknowledges them (``"ack"``) or rejects
    them back to the queue (``"requeue"``). Its consumer tag is ``<name>-1``."""

    def __init__(
        self,
        url: str,
        queue: Queue,
        name: str = "inbox",
        prefetch: int = 10,
        action: str = "hold",
        priority: int | None = None,
    ) -> None:
        self.connection = Connection(url)
        self.channel = self.connection.channel()
        self.name = name
        self.action = action
        self.deliveries: list[Delivery] = []
        target = Queue(
            queue.name,
            DEFAULT_EXCHANGE,
            routing_key=queue.name,
            no_declare=True,
            consumer_arguments=None if priority is None else {"x-priority": priority},
        )
        self.consumer = Consumer(
            self.channel,
            queues=[target],
            callbacks=[self._received],
            prefetch_count=prefetch,
            tag_prefix=f"{name}-",
        )
        self.consumer.consume()

    def _received(self, body: Any, message: Message) -> None:
        self.deliveries.append(Delivery(body, message))
        if self.action == "ack":
            message.ack()
        elif self.action == "requeue":
            message.requeue()

    @property
    def bodies(self) -> list[Any]:
        """The bodies received, in order."""
        return [d.body for d in self.deliveries]

    @property
    def numbers(self) -> list[int]:
        """The ``i`` of each body received (the tests publish ``{"i": n}``), in order."""
        return [d.body["i"] for d in self.deliveries]

    def cancel(self) -> None:
        """``basic.cancel`` the consumer (its unacknowledged deliveries stay with it)."""
        self.consumer.cancel()

    def close(self) -> None:
        """Close the connection (ignoring a dead one)."""
        with contextlib.suppress(Exception):
            self.connection.close()


def pump(inboxes: list[Inbox], until: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Deliver pending frames to ``inboxes`` until ``until()`` holds; fail after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not until():
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"condition not reached in {timeout_s} s: {[i.bodies for i in inboxes]}"
            )
        for inbox in inboxes:
            with contextlib.suppress(socket.timeout):
                inbox.connection.drain_events(timeout=0.05)


def pump_for(inboxes: list[Inbox], seconds: float) -> None:
    """Deliver pending frames to ``inboxes`` for ``seconds`` (to show that nothing more
    comes)."""
    end = time.monotonic() + seconds
    pump(inboxes, lambda: time.monotonic() >= end, timeout_s=seconds + 5)


class ConsumerProcess:
    """A consumer in a process of its own (never acknowledging), so a test can kill or
    pause it. With ``heartbeat_s`` it asks the broker for AMQP heartbeats."""

    def __init__(self, url: str, queue: str, prefetch: int, heartbeat_s: int = 0) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        argv = [url, queue, str(prefetch), str(heartbeat_s)]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.amqp_clients", *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(json.loads(line))

    @property
    def ready(self) -> bool:
        """Whether its consumer is registered."""
        return any(line.get("ready") for line in self.lines)

    @property
    def bodies(self) -> list[Any]:
        """The bodies it received, in order."""
        return [line["body"] for line in self.lines if "body" in line]

    @property
    def error(self) -> str | None:
        """The error its connection ended with, if it did."""
        return next((line["error"] for line in self.lines if "error" in line), None)

    def pause(self) -> None:
        """``kill -STOP`` it: its connection stays open, it sends nothing."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """``kill -CONT`` it."""
        os.kill(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        """``kill -9`` it and wait until it is gone."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self._reader.join(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()


def _consume_forever(url: str, queue: str, prefetch: int, heartbeat_s: int) -> None:
    def received(body: Any, message: Message) -> None:
        line = {"body": body, "redelivered": message.delivery_info.get("redelivered")}
        print(json.dumps(line), flush=True)

    with Connection(url, heartbeat=heartbeat_s) as conn:
        channel = conn.channel()
        target = Queue(queue, DEFAULT_EXCHANGE, routing_key=queue, no_declare=True)
        Consumer(channel, queues=[target], callbacks=[received], prefetch_count=prefetch).consume()
        print(json.dumps({"ready": True}), flush=True)
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=max(heartbeat_s / 4, 0.5))
                if heartbeat_s:
                    conn.heartbeat_check()
        except Exception as exc:  # the test reads how the connection ended
            print(json.dumps({"error": repr(exc)}), flush=True)
            raise


class AmqpClients:
    """Everything a test opens against a cluster, closed (queues deleted, consumer
    processes killed) by ``close()``."""

    def __init__(self, cluster: RabbitCluster) -> None:
        self.cluster = cluster
        self.queues: list[Queue] = []
        self.opened: list[Inbox | Publisher] = []
        self.processes: list[ConsumerProcess] = []

    def queue(self, prefix: str, node: RabbitNode | None = None, **arguments: Any) -> Queue:
        """Declare a new quorum queue through ``node`` (the first node by default), so
        that its leader starts there."""
        queue = quorum_queue(unique_name(prefix), **arguments)
        declare((node or self.cluster.nodes[0]).url, queue)
        self.queues.append(queue)
        return queue

    def many_queues(self, prefix: str, count: int, **arguments: Any) -> list[Queue]:
        """Declare ``count`` new quorum queues through one connection to the first node."""
        queues = [quorum_queue(unique_name(f"{prefix}{i:02d}"), **arguments) for i in range(count)]
        with Connection(self.cluster.nodes[0].url) as conn:
            channel = conn.channel()
            for queue in queues:
                queue(channel).declare()
        self.queues.extend(queues)
        return queues

    def inbox(self, node: RabbitNode, queue: Queue, **options: Any) -> Inbox:
        """A consumer of ``queue`` connected to ``node`` (see ``Inbox``)."""
        inbox = Inbox(node.url, queue, **options)
        self.opened.append(inbox)
        return inbox

    def publisher(self, node: RabbitNode) -> Publisher:
        """A publisher with confirms, connected to ``node``."""
        publisher = Publisher(node.url)
        self.opened.append(publisher)
        return publisher

    def consumer_process(
        self, node: RabbitNode, queue: Queue, prefetch: int, heartbeat_s: int = 0
    ) -> ConsumerProcess:
        """A consumer in its own process, registered before this returns."""
        process = ConsumerProcess(node.url, queue.name, prefetch, heartbeat_s)
        self.processes.append(process)
        deadline = time.monotonic() + 60
        while not process.ready:
            if process.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"consumer process did not start: {process.lines}")
            time.sleep(0.05)
        return process

    def close(self) -> None:
        """Close every client, kill every consumer process, delete every queue."""
        for process in self.processes:
            process.kill()
        for client in self.opened:
            client.close()
        self.cluster.heal()  # deleting a quorum queue needs its quorum
        if not self.queues:
            return
        with Connection(self.cluster.nodes[0].url) as conn:
            channel = conn.channel()
            for queue in self.queues:
                channel.queue_delete(queue.name)


if __name__ == "__main__":
    _consume_forever(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))

"""The brokers benchmark's summary line (``ops/bench/brokers.py``): keylane's own CPU per
event on each broker, RabbitMQ's as a ratio of Redis's, the broker's nodes apart."""

from __future__ import annotations

from keylane.ops.bench.brokers import BrokerRun, own_cpu_line


def run(broker: str, cpu_s: dict[str, float]) -> BrokerRun:
    return BrokerRun(broker, 1000, 0.0, 0.0, 0.0, 0.0, 0, [], cpu_s)


def test_the_summary_counts_receivers_and_workers_only_and_keeps_the_nodes_apart() -> None:
    # Given a Redis run and a RabbitMQ run of 1,000 events each
    redis = run("redis", {"receivers": 0.25, "workers": 0.75, "redis-server": 0.2})
    rabbit = run("rabbitmq", {"receivers": 0.5, "workers": 0.8, "beam.smp": 1.5, "postgres": 0.3})
    # When the summary is written
    line = own_cpu_line([redis, rabbit])
    # Then keylane's own CPU is the receivers' and workers' (1.0 and 1.3 ms an event), the
    # ratio theirs, and the nodes' 1.5 ms is told apart, not in the ratio
    assert "redis 1.000 ms, rabbitmq 1.300 ms = 1.30x Redis mode's" in line
    assert line.endswith("the RabbitMQ nodes apart: 1.500 ms")

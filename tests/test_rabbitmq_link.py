"""The worker's AMQP link, without a broker: what it lets py-amqp log, and how its thread
waits for frames and queued calls."""

from __future__ import annotations

import logging
import os
import resource
import socket
import threading
import time

import pytest
from amqp.abstract_channel import (  # type: ignore[import-untyped]
    AMQP_LOGGER,
    IGNORED_METHOD_DURING_CHANNEL_CLOSE,
)

from keylane.workers.brokers.rabbitmq.calls import Calls
from keylane.workers.brokers.rabbitmq.link import quiet_closing_channels


def test_deliveries_to_a_closing_channel_are_not_warned_of_other_ignored_methods_are(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given the link's filter on py-amqp's logger (installed twice: once is kept)
    quiet_closing_channels()
    quiet_closing_channels()
    assert len(AMQP_LOGGER.filters) == len(set(map(id, AMQP_LOGGER.filters)))
    caplog.set_level(logging.WARNING, logger="amqp")
    # When py-amqp ignores a delivery, then a consume-ok, on channels being closed
    AMQP_LOGGER.warning(IGNORED_METHOD_DURING_CHANNEL_CLOSE, (60, 60), 4)
    AMQP_LOGGER.warning(IGNORED_METHOD_DURING_CHANNEL_CLOSE, (60, 21), 5)
    # Then only the consume-ok is logged: a let-go shard's deliveries go back by design
    assert [r.getMessage() for r in caplog.records] == [
        "Received method (60, 21) during closing channel 5. This method will be ignored"
    ]


def test_a_queued_call_wakes_the_amqp_thread_at_once_and_a_frame_is_told_apart() -> None:
    # Given the calls of an idle connection: nothing to read, nothing queued
    calls = Calls()
    peer, sock = socket.socketpair()
    try:
        started = time.monotonic()
        assert calls.wait(sock, 0.2) is False
        assert time.monotonic() - started >= 0.15  # it waited: nothing woke it
        # When another thread queues a call while the AMQP thread waits up to 30 s
        threading.Timer(0.1, calls.put, [(lambda: None, None)]).start()
        started = time.monotonic()
        # Then the wait ends with the call (long before 30 s), the socket not readable
        assert calls.wait(sock, 30) is False
        assert time.monotonic() - started < 15
        assert calls.get_nowait()[1] is None
        # And a frame from the broker is told apart from a wake, the wake consumed
        peer.send(b"\x01")
        assert calls.wait(sock, 30) is True
        sock.recv(1)
        assert calls.wait(sock, 0) is False
    finally:
        calls.close()
        peer.close()
        sock.close()


def test_the_wait_takes_a_connection_whose_descriptor_is_past_1024() -> None:
    # Given a worker with many descriptors open (destinations' connections, files), so
    # that its AMQP connection's socket and the wake sockets are numbered past 1024
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        pytest.skip(f"the descriptor limit ({soft}) is too low to open 1100")
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        calls = Calls()
        peer, sock = socket.socketpair()
        assert sock.fileno() > 1024
        # When the AMQP thread waits on it, and a frame comes
        try:
            assert calls.wait(sock, 0.05) is False
            peer.send(b"\x01")
            # Then the wait works as below 1024 (select() would raise ValueError)
            assert calls.wait(sock, 30) is True
        finally:
            calls.close()
            peer.close()
            sock.close()
    finally:
        for fd in held:
            os.close(fd)

"""The worker's AMQP link, without a broker: what it lets py-amqp log."""

from __future__ import annotations

import logging

import pytest
from amqp.abstract_channel import (  # type: ignore[import-untyped]
    AMQP_LOGGER,
    IGNORED_METHOD_DURING_CHANNEL_CLOSE,
)

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

"""routing/contract/logcontext.py: log lines that say which event they are about."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from keylane.routing.contract.logcontext import (
    CHATTY_LOGGERS,
    EventFields,
    JsonFormatter,
    KeyValueFormatter,
    configure_logging,
    current_event,
    event_context,
)


@pytest.fixture
def lines() -> Iterator[tuple[logging.Logger, logging.StreamHandler[io.StringIO]]]:
    """A logger of this test's own, writing to a string through keylane's filter."""
    logger = logging.getLogger("kltest.logcontext")
    handler = logging.StreamHandler(io.StringIO())
    handler.addFilter(EventFields())
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    yield logger, handler
    logger.removeHandler(handler)


def test_fields_hold_inside_the_block_nest_and_are_gone_after_it() -> None:
    assert current_event() == {}
    with event_context(source="crm", event_id="e1"):
        with event_context(shard=3, event_id="e2"):
            assert current_event() == {"source": "crm", "event_id": "e2", "shard": 3}
        assert current_event() == {"source": "crm", "event_id": "e1"}
    assert current_event() == {}


def test_current_event_is_a_copy() -> None:
    with event_context(source="crm"):
        current_event()["source"] = "changed"
        assert current_event() == {"source": "crm"}


def test_a_text_line_ends_with_the_events_fields_that_are_set(
    lines: tuple[logging.Logger, logging.StreamHandler[io.StringIO]],
) -> None:
    logger, handler = lines
    handler.setFormatter(KeyValueFormatter())
    # When a line is logged inside an event's block, and one outside it
    with event_context(source="crm", event_id="e1", record_key="contact:1", attempt=2):
        logger.info("applied %s", "it")
    logger.info("idle")
    inside, outside = handler.stream.getvalue().splitlines()
    # Then the first names the event, in the fixed order, and the second nothing
    assert inside.endswith(
        " INFO kltest.logcontext applied it source=crm event_id=e1 record_key=contact:1 attempt=2"
    )
    assert outside.endswith(" INFO kltest.logcontext idle")


def test_a_text_line_carries_its_exception(
    lines: tuple[logging.Logger, logging.StreamHandler[io.StringIO]],
) -> None:
    logger, handler = lines
    handler.setFormatter(KeyValueFormatter())
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    text = handler.stream.getvalue()
    assert "failed\nTraceback" in text
    assert text.rstrip().endswith("ValueError: boom")


def test_a_json_line_is_one_object_with_the_events_fields(
    lines: tuple[logging.Logger, logging.StreamHandler[io.StringIO]],
) -> None:
    logger, handler = lines
    handler.setFormatter(JsonFormatter())
    with event_context(source="crm", shard=5, batch=["e1", "e2"]):
        logger.warning("slow %d", 3)
    doc = json.loads(handler.stream.getvalue())
    assert set(doc) == {"ts", "level", "logger", "message", "source", "shard", "batch"}
    assert (doc["level"], doc["logger"], doc["message"]) == (
        "WARNING",
        "kltest.logcontext",
        "slow 3",
    )
    assert (doc["source"], doc["shard"], doc["batch"]) == ("crm", 5, ["e1", "e2"])


def test_fields_a_line_was_given_itself_win_over_the_block(
    lines: tuple[logging.Logger, logging.StreamHandler[io.StringIO]],
) -> None:
    logger, handler = lines
    handler.setFormatter(JsonFormatter())
    with event_context(shard=5):
        logger.info("moved", extra={"shard": 9})
    assert json.loads(handler.stream.getvalue())["shard"] == 9


@pytest.fixture
def root_logging() -> Iterator[None]:
    """The root logger and the chatty libraries' levels as they were, afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    chatty = {name: logging.getLogger(name).level for name in CHATTY_LOGGERS}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, was in chatty.items():
        logging.getLogger(name).setLevel(was)


@pytest.mark.usefixtures("root_logging")
def test_configure_logging_puts_one_stderr_handler_in_the_format_asked() -> None:
    configure_logging("info", "json")
    root = logging.getLogger()
    (handler,) = root.handlers
    assert isinstance(handler, logging.StreamHandler)
    assert handler.stream is sys.stderr
    assert isinstance(handler.formatter, JsonFormatter)
    assert any(isinstance(f, EventFields) for f in handler.filters)
    assert root.level == logging.INFO
    assert {logging.getLogger(n).level for n in CHATTY_LOGGERS} == {logging.WARNING}


@pytest.mark.usefixtures("root_logging")
def test_at_debug_the_chatty_libraries_speak_too() -> None:
    configure_logging("DEBUG", "text")
    (handler,) = logging.getLogger().handlers
    assert isinstance(handler.formatter, KeyValueFormatter)
    assert {logging.getLogger(n).level for n in CHATTY_LOGGERS} == {logging.DEBUG}

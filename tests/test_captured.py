"""A captured request read from a file (``keylane sources try``): its head ends at its
first blank line, whatever line ends the head and the body use."""

from __future__ import annotations

import pytest

from keylane.ops.captured import read_captured
from keylane.routing.contract.errors import ConfigError

MULTIPART = b'--xx\r\nContent-Disposition: form-data; name="a"\r\n\r\nhello\r\n--xx--\r\n'


def test_a_head_written_with_lf_before_a_crlf_body_ends_at_its_own_blank_line() -> None:
    # Given a head with LF line ends (an editor's) and a multipart body with CRLF ones
    raw = (
        b"POST /webhooks/jotform?key=k HTTP/1.1\n"
        b"Content-Type: multipart/form-data; boundary=xx\n"
        b"Content-Length: %d\n\n" % len(MULTIPART)
    ) + MULTIPART
    # When it is read
    request = read_captured(raw)
    # Then the body is the multipart body, byte for byte (the body's first blank line
    # was taken for the head's end before)
    assert request.body == MULTIPART
    assert request.headers["content-type"] == "multipart/form-data; boundary=xx"
    assert (request.method, request.path, request.query) == ("POST", "/webhooks/jotform", b"key=k")


def test_a_crlf_head_before_a_body_with_lf_blank_lines_ends_at_its_own() -> None:
    body = b'{"a":\n\n1}'
    raw = b"POST /webhooks/x HTTP/1.1\r\nContent-Type: application/json\r\n\r\n" + body
    assert read_captured(raw).body == body


def test_content_length_cuts_an_editor_s_final_newline() -> None:
    raw = b"POST /webhooks/x HTTP/1.1\nContent-Length: 2\n\n{}\n"
    assert read_captured(raw).body == b"{}"


def test_a_content_length_longer_than_the_body_is_named() -> None:
    with pytest.raises(ConfigError, match="Content-Length 9"):
        read_captured(b"POST /webhooks/x HTTP/1.1\nContent-Length: 9\n\n{}")

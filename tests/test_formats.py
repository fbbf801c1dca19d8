"""Every body format read into one tree (``producers/formats/``): forms with bracketed
keys, multipart with files kept as their digest, XML and SOAP through a hardened parser,
JSON inside a field; and each bad body a clear 4xx naming what is wrong."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from keylane.producers.formats import digest_of, format_of, read_tree
from keylane.producers.formats.limits import MAX_FIELD_BYTES
from keylane.routing.contract.errors import InvalidEvent

SOAP = b"""<?xml version="1.0" encoding="UTF-8"?>
<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/"
    xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
 <soapenv:Body>
  <notifications xmlns="http://soap.sforce.com/2005/09/outbound">
   <OrganizationId>00D5e000000KQ2eEAG</OrganizationId>
   <SessionId xsi:nil="true"/>
   <Notification>
    <Id>04l5e00000Gx7QzAAJ</Id>
    <sObject xsi:type="sf:Contact" xmlns:sf="urn:sobject.enterprise.soap.sforce.com">
     <sf:Id>0035e00000ZkM3hAAF</sf:Id>
     <sf:Email>ann@example.com</sf:Email>
    </sObject>
   </Notification>
  </notifications>
 </soapenv:Body>
</soapenv:Envelope>"""


def multipart(*parts: tuple[str, bytes, str | None], boundary: str = "XyZ") -> bytes:
    """A multipart/form-data body of (name, bytes, file name or None) parts."""
    out = b""
    for name, data, filename in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"\r\nContent-Type: text/plain'
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        out += data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def refused(body: bytes, content_type: str, form: str, fields: tuple[str, ...] = ()) -> Any:
    with pytest.raises(InvalidEvent) as caught:
        read_tree(body, content_type, form, fields)
    return caught.value


def test_a_form_body_nests_bracketed_keys_and_repeats_make_lists() -> None:
    # Given Mailchimp's bracketed keys, a repeated key and a[] entries
    body = (
        b"type=subscribe&data[merges][FNAME]=Ann&data[email]=ann%40example.com"
        b"&tag=a&tag=b&ids[]=1&ids[]=2&one[]=x&row[0]=first&plus=a+b"
    )
    tree = read_tree(body, "application/x-www-form-urlencoded", "form")
    # Then each reads as the common web frameworks read it
    assert tree == {
        "type": "subscribe",
        "data": {"merges": {"FNAME": "Ann"}, "email": "ann@example.com"},
        "tag": ["a", "b"],
        "ids": ["1", "2"],
        "one": ["x"],
        "row": {"0": "first"},
        "plus": "a b",
    }


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"a=1&a[b]=2", "form_conflict"),
        (b"a[b]=2&a=1", "form_conflict"),
        (b"a[][b]=1", "malformed_form"),
        (b"k" + b"[x]" * 40 + b"=1", "too_deep"),
        (b"&".join(b"f%d=1" % i for i in range(1001)), "too_many_fields"),
        (b"name=%ff", "malformed_form"),
    ],
)
def test_a_form_body_that_cannot_be_one_tree_is_a_400_naming_why(body: bytes, code: str) -> None:
    error = refused(body, "application/x-www-form-urlencoded", "form")
    assert (error.status, error.code) == (400, code)


def test_a_multipart_body_keeps_text_fields_and_only_the_digest_of_a_file() -> None:
    # Given Jotform's multipart body: text fields, answers as JSON in rawRequest, a file
    raw = b'{"q3_email": "ann@example.com", "q4_name": {"first": "Ann"}}'
    body = multipart(
        ("formID", b"241", None),
        ("rawRequest", raw, None),
        ("tags[]", b"a", None),
        ("upload", b"hello", "cv.txt"),
    )
    tree = read_tree(body, "multipart/form-data; boundary=XyZ", "multipart", ("rawRequest",))
    # Then the fields are text, rawRequest is read as JSON, and the file is never kept
    assert tree == {
        "formID": "241",
        "rawRequest": {"q3_email": "ann@example.com", "q4_name": {"first": "Ann"}},
        "tags": ["a"],
        "upload": {
            "filename": "cv.txt",
            "content_type": "text/plain",
            "size": 5,
            "sha256": hashlib.sha256(b"hello").hexdigest(),
        },
    }


def test_a_bad_multipart_body_is_a_4xx_naming_why() -> None:
    body = multipart(("a", b"1", None))
    assert refused(body, "multipart/form-data", "multipart").code == "malformed_multipart"
    cut = body[: len(body) // 2]
    assert refused(cut, "multipart/form-data; boundary=XyZ", "multipart").code == (
        "malformed_multipart"
    )
    big = multipart(("essay", b"x" * (MAX_FIELD_BYTES + 1), None))
    error = refused(big, "multipart/form-data; boundary=XyZ", "multipart")
    assert (error.status, error.code) == (413, "part_too_large")
    # A file part of the same size is only hashed
    tree = read_tree(
        multipart(("file", b"x" * (MAX_FIELD_BYTES + 1), "big.bin")),
        "multipart/form-data; boundary=XyZ",
        "multipart",
    )
    assert tree["file"]["size"] == MAX_FIELD_BYTES + 1


def test_a_soap_message_reads_by_local_names_with_nil_and_type() -> None:
    tree = read_tree(SOAP, "text/xml; charset=utf-8", "xml")
    notifications = tree["Envelope"]["Body"]["notifications"]
    assert notifications["OrganizationId"] == "00D5e000000KQ2eEAG"
    assert notifications["SessionId"] is None
    assert notifications["Notification"] == {
        "Id": "04l5e00000Gx7QzAAJ",
        "sObject": {
            "@type": "sf:Contact",
            "Id": "0035e00000ZkM3hAAF",
            "Email": "ann@example.com",
        },
    }
    # And a repeated element is a list, in order
    two = SOAP.replace(
        b"</Notification>", b"</Notification><Notification><Id>2</Id></Notification>"
    )
    listed = read_tree(two, "text/xml", "xml")["Envelope"]["Body"]["notifications"]
    assert [n["Id"] for n in listed["Notification"]] == ["04l5e00000Gx7QzAAJ", "2"]


@pytest.mark.parametrize(
    "body",
    [
        # an entity expansion bomb
        b'<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;">]><l>&b;</l>',
        # an external entity (a file)
        b'<?xml version="1.0"?><!DOCTYPE f [<!ENTITY x SYSTEM "file:///etc/passwd">]><f>&x;</f>',
        # an external DTD (fetched by a naive parser)
        b'<?xml version="1.0"?><!DOCTYPE f SYSTEM "http://127.0.0.1:9/evil.dtd"><f/>',
    ],
)
def test_xml_with_a_dtd_or_entities_is_refused_before_anything_is_expanded(body: bytes) -> None:
    error = refused(body, "application/xml", "xml")
    assert (error.status, error.code) == (400, "xml_forbidden")


def test_xml_that_is_not_well_formed_or_too_deep_is_a_400() -> None:
    assert refused(b"<a><b></a>", "text/xml", "xml").code == "malformed_xml"
    deep = b"<a>" * 40 + b"x" + b"</a>" * 40
    assert refused(deep, "text/xml", "xml").code == "too_deep"


def test_json_inside_a_field_must_be_json() -> None:
    error = refused(b"payload=%7Bnot", "application/x-www-form-urlencoded", "form", ("payload",))
    assert error.code == "malformed_json"
    assert "field payload" in str(error)


def test_the_format_is_the_media_types_unless_the_source_names_one() -> None:
    assert format_of("application/json; charset=utf-8") == "json"
    assert format_of("application/vnd.api+json") == "json"
    assert format_of("application/x-www-form-urlencoded") == "form"
    assert format_of("multipart/form-data; boundary=x") == "multipart"
    assert format_of("text/xml") == format_of("application/soap+xml") == "xml"
    assert format_of("text/plain", "json") == "json"
    with pytest.raises(InvalidEvent) as caught:
        format_of("text/plain")
    assert (caught.value.status, caught.value.code) == (415, "unsupported_media_type")


def test_the_digest_leaves_out_what_a_sender_changes_when_it_retries() -> None:
    first = {"eventId": 1, "attemptNumber": 0, "meta": {"attempt": 1, "id": "m"}}
    retry = {"attemptNumber": 3, "eventId": 1, "meta": {"id": "m", "attempt": 2}}
    excludes = ("attemptNumber", "meta.attempt")
    assert digest_of(first, excludes) == digest_of(retry, excludes)
    assert digest_of(first) != digest_of(retry)
    assert first["attemptNumber"] == 0  # the tree itself is left as it was

"""Source definitions and how a delivery is read through them (no I/O)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from keylane.producers.intake import KEYLESS_PREFIX, Ignored, Intake, load_hook, take_in
from keylane.producers.signatures import Verified, verifiers_of
from keylane.routing.contract.errors import ConfigError, InvalidEvent
from keylane.routing.contract.settings_env import load_settings
from keylane.routing.contract.sources import (
    DEMO,
    SourceConfig,
    Sources,
    load_sources,
    parse_sources,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "ops" / "examples" / "sources.toml"
UNSIGNED = Verified("none", None, None)


def _source(**table: object) -> SourceConfig:
    return SourceConfig(name="s", **table)  # type: ignore[arg-type]


def test_no_sources_file_means_the_demo_source() -> None:
    sources = load_sources(load_settings())
    assert sources.names() == ["demo"]
    assert sources.get("demo") == DEMO
    assert DEMO.unsigned
    assert DEMO.ownership.everything


def test_the_example_file_parses_and_names_its_secrets() -> None:
    sources = parse_sources(EXAMPLE.read_text())
    assert sources.names() == ["forms", "github", "internal", "shopify", "stripe"]
    stripe = sources.get("stripe")
    assert stripe is not None
    assert stripe.verify.scheme == "stripe"
    assert stripe.on["invoice.paid"]["paid_total"].op == "increment"
    # Then a missing secret is a start-up error naming the variable
    with pytest.raises(ConfigError, match="FORMS_WEBHOOK_SECRET is not set"):
        verifiers_of(sources, {})


def test_retention_follows_the_providers_retry_windows() -> None:
    settings = load_settings()
    sources = parse_sources(EXAMPLE.read_text())
    days = {name: sources.get(name).retention(settings) / 86400 for name in sources.names()}  # type: ignore[union-attr]
    assert days == {"stripe": 3, "forms": 2, "github": 3, "shopify": 3, "internal": 3}
    assert _source(retention_s=60).retention(settings) == 60


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x = 1", "no \\[sources"),
        ("[sources.Bad]\n", "lowercase"),
        ('[sources.a]\nformat = "mapped"\n', "needs record_key"),
        ('[sources.a]\nrecord_key = "k:{body:id}"\n', 'format = \\"mapped\\" only'),
        ('[sources.a]\nevent_id = "id"\n', "not a reference"),
        (
            '[sources.a]\nverify = {scheme = "stripe", secrets_env = ["S"]}\n'
            'event_id = "signature"\n',
            "has no id header",
        ),
        ('[sources.a]\nformat = "mapped"\nrecord_key = "k"\non.x.f = {set = 1}\n', "no \\{body"),
        (
            '[sources.a]\nformat = "mapped"\nrecord_key = "{body:k}"\non.x.f = {mul = 1}\n',
            "unknown operation",
        ),
        ('[sources.a]\nhook = "nocolon"\nformat = "mapped"\n', "module:function"),
        ("[sources.a]\nunknown = 1\n", "Extra inputs"),
        ("[sources.a\n", "not valid TOML"),
    ],
)
def test_bad_sources_files_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_sources(text)


def test_event_id_rules() -> None:
    body = b'{"id": "evt_1", "record_key": "k", "changes": {"a": {"set": 1}}}'
    payload = {"id": "evt_1", "record_key": "k", "changes": {"a": {"set": 1}}}
    headers = {"x-id": "hdr-7"}
    signed = Verified("standard_webhooks", "msg_9", 0.0)

    def event_id(rule: str, verified: Verified = UNSIGNED) -> str:
        intake = take_in(_source(event_id=rule), verified, body, payload, headers)
        assert isinstance(intake, Intake)
        return intake.event_id

    assert event_id("body:id") == "evt_1"
    assert event_id("header:X-Id") == "hdr-7"
    assert event_id("content-hash") == "sha256:" + hashlib.sha256(body).hexdigest()
    signed_source = _source(
        event_id="signature", verify={"scheme": "standard_webhooks", "secrets_env": ["S"]}
    )
    intake = take_in(signed_source, signed, body, payload, headers)
    assert isinstance(intake, Intake)
    assert intake.event_id == "msg_9"


@pytest.mark.parametrize(
    ("verify", "rule"),
    [
        ({"scheme": "standard_webhooks", "secrets_env": ["S"]}, "signature"),  # webhook-id
        ({"scheme": "github", "secrets_env": ["S"]}, "signature"),  # X-GitHub-Delivery
        ({"scheme": "shopify", "secrets_env": ["S"]}, "signature"),  # X-Shopify-Webhook-Id
        ({"scheme": "stripe", "secrets_env": ["S"]}, "body:id"),  # evt_... in the body
        (
            {"scheme": "hmac", "secrets_env": ["S"], "header": "X-S", "event_id_header": "X-Id"},
            "signature",
        ),
        ({"scheme": "hmac", "secrets_env": ["S"], "header": "X-S"}, "body:id"),
        ({"scheme": "none"}, "body:id"),
    ],
)
def test_a_source_takes_the_event_id_its_scheme_carries_unless_told(
    verify: dict[str, object], rule: str
) -> None:
    # Given a source that does not say where its event ids live
    source = _source(verify=verify, task="sync", record_key="c:{body:email}")
    # Then they are taken from where its signature scheme carries them
    assert source.event_id is None
    assert source.event_id_rule == rule
    # And a source that says so keeps its own rule
    assert _source(verify=verify, event_id="header:X-Req").event_id_rule == "header:X-Req"


def test_a_standard_webhooks_source_without_event_id_dedupes_on_webhook_id() -> None:
    # Given a Standard Webhooks source naming no event_id, and a body without an "id"
    source = _source(
        verify={"scheme": "standard_webhooks", "secrets_env": ["S"]},
        task="sync_contact",
        record_key="contact:{body:email}",
    )
    body = b'{"email": "ada@example.com"}'
    # When a delivery signed with webhook-id msg_0 is read, twice (a retry)
    ids = [
        take_in(source, Verified("standard_webhooks", "msg_0", 0.0), body, {"email": "a"}, {})
        for _ in range(2)
    ]
    # Then both carry the sender's id: the retry is a duplicate, never keyless
    assert {(i.event_id, i.key_missing) for i in ids if isinstance(i, Intake)} == {("msg_0", False)}


def test_a_source_whose_deliveries_may_all_be_keyless_is_warned_about() -> None:
    hmac = {"scheme": "hmac", "secrets_env": ["S"], "header": "X-S"}
    # Given sources whose ids live nowhere anyone said: an HMAC scheme with no id header,
    # a mapped or forwarding source with no event_id
    risky = [
        _source(verify=hmac, task="t", record_key="c:{body:e}"),
        _source(format="mapped", record_key="c:{body:e}", on={"*": {"f": {"set": 1}}}),
    ]
    # And sources whose ids are where the sender puts them
    safe = [
        _source(verify=hmac | {"event_id_header": "X-Id"}, task="t", record_key="c:{body:e}"),
        _source(
            verify={"scheme": "stripe", "secrets_env": ["S"]}, task="t", record_key="c:{body:e}"
        ),
        _source(verify=hmac, task="t", record_key="c:{body:e}", event_id="body:event_id"),
        _source(verify=hmac, task="t", record_key="c:{body:e}", missing_id="content-hash"),
        _source(verify=hmac),  # keylane's envelope: its "id"
        DEMO,
    ]
    # Then each of the first gets a start-up warning that says why, the others none
    for source in risky:
        assert any("KEYLESS" in w for w in source.start_up_warnings()), source
    for source in safe:
        assert not any("KEYLESS" in w for w in source.start_up_warnings()), source


def test_a_missing_event_id_never_matches_another() -> None:
    # Given deliveries without an id
    payload = {"record_key": "k", "changes": {"a": {"increment": 1}}}
    body = b"{}"
    unique = [take_in(_source(), UNSIGNED, body, payload, {}) for _ in range(3)]
    # Then each gets its own synthetic id, marked as missing
    ids = {i.event_id for i in unique if isinstance(i, Intake)}
    assert len(ids) == 3
    assert all(i.startswith(KEYLESS_PREFIX) for i in ids)
    assert all(isinstance(i, Intake) and i.key_missing for i in unique)
    # Or the body's hash, when the source says so, so exact re-sends dedupe
    hashed = take_in(_source(missing_id="content-hash"), UNSIGNED, body, payload, {})
    assert isinstance(hashed, Intake)
    assert hashed.event_id.startswith("sha256:")
    assert hashed.key_missing
    # Or a 400, when the source demands ids
    with pytest.raises(InvalidEvent, match="no event id"):
        take_in(_source(missing_id="reject"), UNSIGNED, body, payload, {})


STRIPE_INVOICE = {
    "id": "evt_1",
    "type": "invoice.paid",
    "data": {"object": {"id": "in_1", "customer": "cus_9", "amount_paid": 1200}},
}


def test_mapped_source_reads_key_and_changes_per_event_type() -> None:
    stripe = parse_sources(EXAMPLE.read_text()).get("stripe")
    assert stripe is not None
    intake = take_in(stripe, UNSIGNED, b"", STRIPE_INVOICE, {})
    assert intake == Intake(
        "evt_1",
        False,
        "invoice.paid",
        "customer:cus_9",
        {
            "paid_total": {"op": "increment", "value": 1200},
            "invoices": {"op": "add", "value": "in_1"},
            "status": {"op": "set", "value": "active"},
        },
        digest=hashlib.sha256(b"").hexdigest(),  # of the body as it came
    )


def test_mapped_source_ignores_unmapped_types_and_refuses_unroutable_deliveries() -> None:
    stripe = parse_sources(EXAMPLE.read_text()).get("stripe")
    assert stripe is not None
    other = {**STRIPE_INVOICE, "type": "charge.refunded"}
    assert isinstance(take_in(stripe, UNSIGNED, b"", other, {}), Ignored)
    no_customer = {"id": "evt_2", "type": "invoice.paid", "data": {"object": {"id": "in_2"}}}
    with pytest.raises(InvalidEvent, match="no record key"):
        take_in(stripe, UNSIGNED, b"", no_customer, {})
    wrong_type = {
        **STRIPE_INVOICE,
        "data": {"object": {"customer": "c", "amount_paid": "lots", "id": "i"}},
    }
    with pytest.raises(InvalidEvent, match="increment needs a finite number"):
        take_in(stripe, UNSIGNED, b"", wrong_type, {})


def test_absent_mapped_fields_are_left_out() -> None:
    source = _source(
        format="mapped",
        record_key="k:{body:id}",
        on={"*": {"a": {"set": "body:a"}, "b": {"set": "body:b"}}},
    )
    intake = take_in(source, UNSIGNED, b"", {"id": 1, "type": "t", "a": 5}, {})
    assert isinstance(intake, Intake)
    assert intake.changes == {"a": {"op": "set", "value": 5}}
    nothing = take_in(source, UNSIGNED, b"", {"id": 1, "type": "t"}, {})
    assert isinstance(nothing, Ignored)


def test_hook_maps_or_ignores_and_its_errors_are_400() -> None:
    shopify = parse_sources(EXAMPLE.read_text()).get("shopify")
    assert shopify is not None
    hook = load_hook(shopify)
    order = {
        "id": 820982911946154508,
        "total_price": "10.50",
        "customer": {"id": 115310627314723954},
    }
    intake = take_in(shopify, UNSIGNED, b"", order, {"x-shopify-topic": "orders/create"}, hook)
    assert isinstance(intake, Intake)
    assert intake.record_key == "shopify-customer:115310627314723954"
    assert intake.changes["spent_cents"] == {"op": "increment", "value": 1050}
    other = take_in(shopify, UNSIGNED, b"", order, {"x-shopify-topic": "orders/paid"}, hook)
    assert isinstance(other, Ignored)
    with pytest.raises(InvalidEvent, match="hook could not map"):
        take_in(shopify, UNSIGNED, b"", {"id": 1}, {"x-shopify-topic": "orders/create"}, hook)


def test_a_hook_that_cannot_be_imported_is_a_start_up_error() -> None:
    source = _source(format="mapped", hook="nowhere.module:fn")
    with pytest.raises(ConfigError, match="cannot load hook"):
        load_hook(source)


def test_sources_lookup() -> None:
    sources = Sources([DEMO, _source()])
    assert sources.names() == ["demo", "s"]
    assert sources.get("nope") is None

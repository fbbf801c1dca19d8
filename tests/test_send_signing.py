"""The signing half of each verifier (``producers/signatures/signer.py``, what ``keylane
send`` signs with): every preset's delivery signed by keylane is verified by keylane's own
verifier, and where the provider's SDK or recipe signs (tests/support/signers.py), keylane
signs the same bytes the same way."""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest

from keylane.producers.signatures import NO_TARGET, Target, build_verifier, parse_verify_config
from keylane.producers.signatures.signer import Outgoing, sign
from keylane.routing.contract.errors import ConfigError, SignatureError
from keylane.routing.contract.presets import PRESETS
from tests.support.signers import SIGNERS
from tests.support.signers import Outgoing as SdkOutgoing

CALLED = "https://hooks.example.com/webhooks/x"
BODY = b'{"id": "evt_1", "type": "contact.updated"}'
FORM = b"From=%2B15550100&Body=hi+there&MessageSid=SM1"

#: A secret of the form each scheme takes (most: any text).
SECRETS = {
    "close": "0a1b2c3d4e5f",
    "airtable": base64.b64encode(b"airtable key").decode(),
    "standard_webhooks": "whsec_" + base64.b64encode(b"standard key").decode(),
    "stripe": "whsec_test",
    "basic": "ada:s3cret",
    "pipedrive": "ada:s3cret",
}
#: Checks whose proof is in the body the sender writes: nothing to sign.
IN_BODY = {"salesforce", "microsoft_graph"}


def _config(scheme: str) -> Any:
    table: dict[str, Any] = {"scheme": scheme, "secrets_env": ["S"]}
    if PRESETS[scheme].check == "none" or scheme == "salesforce":
        table.pop("secrets_env")
    if scheme == "salesforce":
        table["organization_id"] = ["00D5e000000KQ2eEAG"]
    if scheme == "token":
        table["token"] = "header:X-Api-Key"
    return parse_verify_config(table)


def _signed(scheme: str, body: bytes, content_type: str, now: float) -> tuple[dict[str, str], str]:
    headers = {"content-type": content_type, "webhook-id": "msg_1", "x-github-delivery": "d1"}
    signature = sign(
        _config(scheme), SECRETS.get(scheme, "s3cret"), Outgoing(body, headers, "", CALLED), now
    )
    return {**headers, **signature.headers}, signature.query


@pytest.mark.parametrize("scheme", sorted(set(PRESETS) - IN_BODY))
@pytest.mark.parametrize("form", [False, True], ids=["json", "form"])
def test_what_keylane_signs_its_verifier_verifies(scheme: str, form: bool) -> None:
    # Given a delivery signed as the scheme's sender signs it
    now = time.time()
    body, content_type = (
        (FORM, "application/x-www-form-urlencoded") if form else (BODY, "application/json")
    )
    headers, query = _signed(scheme, body, content_type, now)
    # When the receiver's own verifier checks it, with the URL and query it came on
    params = dict(p.split("=", 1) for p in query.split("&")) if query else {}
    target = Target("POST", f"{CALLED}?{query}" if query else CALLED, params)
    verifier = build_verifier(_config(scheme), [SECRETS.get(scheme, "s3cret")])
    verified = verifier.verify(headers, body, now, target)
    # Then it is verified; and with another secret it is not
    assert verified.scheme == scheme
    if PRESETS[scheme].check != "none":
        other = build_verifier(_config(scheme), [_other(scheme)])
        with pytest.raises(SignatureError):
            other.verify(headers, body, now, target)


def _other(scheme: str) -> str:
    if scheme == "close":
        return "ffee"
    if scheme in ("airtable", "standard_webhooks"):
        return SECRETS[scheme].replace("a", "b", 1)
    return "ada:other" if scheme in ("basic", "pipedrive") else "another"


@pytest.mark.parametrize("scheme", sorted(set(SIGNERS) & set(PRESETS)))
def test_keylane_signs_as_the_provider_s_sdk_or_recipe_signs(scheme: str) -> None:
    # Given one delivery (a form, which Twilio signs field by field), one secret, one second
    at = 1_760_000_000
    content_type = "application/x-www-form-urlencoded"
    secret = SECRETS.get(scheme, "s3cret")
    out = Outgoing(FORM, {"content-type": content_type, "webhook-id": "msg_1"}, "", CALLED)
    ours = sign(_config(scheme), secret, out, at).headers
    sdk = SIGNERS[scheme](secret, SdkOutgoing(FORM, url=CALLED, headers=out.headers), at)
    # Then every header keylane signs with, the SDK wrote with the same value
    theirs = {k.lower(): v for k, v in sdk.items()}
    assert ours
    assert {k.lower(): v for k, v in ours.items()} == {k.lower(): theirs[k.lower()] for k in ours}


def test_a_sources_file_hmac_scheme_signs_its_timestamp_and_event_id() -> None:
    # Given an hmac table that signs a timestamp, the event id and the body
    config = parse_verify_config(
        {
            "scheme": "hmac",
            "secrets_env": ["S"],
            "header": "X-Signature",
            "encoding": "base64",
            "prefix": "v1=",
            "timestamp_header": "X-Timestamp",
            "event_id_header": "X-Event-Id",
            "signed_payload": "{timestamp}.{event_id}.{body}",
        }
    )
    now = time.time()
    headers = {"content-type": "application/json", "X-Event-Id": "e1"}
    signature = sign(config, "s3cret", Outgoing(BODY, headers), now)
    # Then its verifier takes it, vouching for the id
    verified = build_verifier(config, ["s3cret"]).verify(
        {**headers, **signature.headers}, BODY, now
    )
    assert (verified.event_id, verified.timestamp) == ("e1", float(int(now)))
    # And without an id to sign, it says so
    with pytest.raises(ConfigError, match="--event-id"):
        sign(config, "s3cret", Outgoing(BODY, {}), now)


def test_schemes_that_sign_the_url_need_the_url_the_receiver_takes() -> None:
    for scheme in ("twilio", "square", "hubspot"):
        with pytest.raises(ConfigError, match="KEYLANE_PUBLIC_URL"):
            sign(_config(scheme), "s3cret", Outgoing(BODY, {"content-type": "application/json"}), 0)


def test_a_signed_scheme_without_a_secret_is_refused_and_none_adds_nothing() -> None:
    with pytest.raises(ConfigError, match="signs with a secret"):
        sign(_config("github"), None, Outgoing(BODY, {}), 0)
    none = sign(parse_verify_config({"scheme": "none"}), None, Outgoing(BODY, {}, "a=1"), 0)
    assert (none.headers, none.query) == ({}, "a=1")
    assert NO_TARGET.url == ""

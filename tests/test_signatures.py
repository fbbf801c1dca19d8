"""Signature verification, checked against the senders' own signing code.

Stripe and Standard Webhooks deliveries are signed with the real ``stripe`` and
``standardwebhooks`` packages; GitHub and Shopify ones from their documented schemes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from secrets import token_hex

import pytest
import stripe
from pydantic import SecretStr, ValidationError
from standardwebhooks.webhooks import Webhook
from starlette.datastructures import Headers

from keylane.producers.signatures import (
    GithubConfig,
    HmacConfig,
    NoneConfig,
    ShopifyConfig,
    StandardWebhooksConfig,
    StripeConfig,
    Verified,
    Verifier,
    VerifyConfig,
    build_verifier,
    load_secrets,
    parse_verify_config,
    verifier_from_environ,
)
from keylane.routing.contract.errors import ConfigError, SignatureError

NOW = 1_700_000_000.0
BODY = (
    b'{"id": "evt_1", "type": "contact.updated", "record_key": "contact:42", '
    b'"changes": {"visits": {"increment": 1}, "name": {"set": "Zo\xc3\xab"}}}'
)
Sign = Callable[[str, bytes, float], dict[str, str]]


# -- signing, as each sender does it ---------------------------------------------------


def svix_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


def sign_svix(secret: str, body: bytes, timestamp: float, msg_id: str = "msg_1") -> dict[str, str]:
    signed_at = datetime.fromtimestamp(timestamp, tz=UTC)
    signature = Webhook(secret).sign(msg_id, signed_at, body.decode())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(timestamp)),
        "webhook-signature": signature,
    }


def stripe_secret() -> str:
    return "whsec_" + token_hex(16)


def sign_stripe(secret: str, body: bytes, timestamp: float) -> dict[str, str]:
    header = stripe.WebhookSignature.generate_signature_header(
        body.decode(), secret, timestamp=int(timestamp)
    )
    return {"Stripe-Signature": header}


def plain_secret() -> str:
    return token_hex(20)


def sign_github(secret: str, body: bytes, timestamp: float) -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": f"sha256={digest}", "X-GitHub-Delivery": "delivery-1"}


def sign_shopify(secret: str, body: bytes, timestamp: float) -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).digest()
    return {
        "X-Shopify-Hmac-Sha256": base64.b64encode(digest).decode(),
        "X-Shopify-Webhook-Id": "webhook-1",
    }


FORMS = HmacConfig(
    secrets_env=("FORMS_SECRET",),
    header="X-Forms-Signature",
    prefix="sha256=",
    timestamp_header="X-Forms-Timestamp",
    signed_payload="{timestamp}.{body}",
    event_id_header="X-Forms-Event",
)


def sign_forms(secret: str, body: bytes, timestamp: float) -> dict[str, str]:
    signed = f"{int(timestamp)}.".encode() + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return {
        "X-Forms-Signature": f"sha256={digest}",
        "X-Forms-Timestamp": str(int(timestamp)),
        "X-Forms-Event": "form-1",
    }


@dataclass(frozen=True)
class Scheme:
    name: str
    config: VerifyConfig
    new_secret: Callable[[], str]
    sign: Sign
    required_headers: tuple[str, ...]
    signature_header: str
    malformed_signatures: tuple[str, ...]
    event_id: str | None
    timestamped: bool

    def verifier(self, *secrets: str) -> Verifier:
        return build_verifier(self.config, list(secrets))


SCHEMES = [
    Scheme(
        name="standard_webhooks",
        config=StandardWebhooksConfig(secrets_env=("SVIX_SECRET",)),
        new_secret=svix_secret,
        sign=sign_svix,
        required_headers=("webhook-id", "webhook-timestamp", "webhook-signature"),
        signature_header="webhook-signature",
        malformed_signatures=("garbage", "v1", "v1,not*base64", "v2,c2lnbmF0dXJl"),
        event_id="msg_1",
        timestamped=True,
    ),
    Scheme(
        name="stripe",
        config=StripeConfig(secrets_env=("STRIPE_WHSEC",)),
        new_secret=stripe_secret,
        sign=sign_stripe,
        required_headers=("Stripe-Signature",),
        signature_header="Stripe-Signature",
        malformed_signatures=(
            "garbage",
            "v1=abcd",
            "t=1700000000",
            "t=soon,v1=abcd",
            "t=1700000000,v1=not-hex",
            "t=1700000000,v0=abcd",
        ),
        event_id=None,
        timestamped=True,
    ),
    Scheme(
        name="github",
        config=GithubConfig(secrets_env=("GITHUB_SECRET",)),
        new_secret=plain_secret,
        sign=sign_github,
        required_headers=("X-Hub-Signature-256",),
        signature_header="X-Hub-Signature-256",
        malformed_signatures=("abcd", "sha1=abcd", "sha256=not-hex", "sha256=abc"),
        event_id="delivery-1",
        timestamped=False,
    ),
    Scheme(
        name="shopify",
        config=ShopifyConfig(secrets_env=("SHOPIFY_SECRET",)),
        new_secret=plain_secret,
        sign=sign_shopify,
        required_headers=("X-Shopify-Hmac-Sha256",),
        signature_header="X-Shopify-Hmac-Sha256",
        malformed_signatures=("not*base64", "abc"),
        event_id="webhook-1",
        timestamped=False,
    ),
    Scheme(
        name="hmac",
        config=FORMS,
        new_secret=plain_secret,
        sign=sign_forms,
        required_headers=("X-Forms-Signature", "X-Forms-Timestamp"),
        signature_header="X-Forms-Signature",
        malformed_signatures=("abcd", "sha256=xyz", "sha512=abcd"),
        event_id="form-1",
        timestamped=True,
    ),
]
TIMESTAMPED = [s for s in SCHEMES if s.timestamped]


@pytest.fixture(params=SCHEMES, ids=lambda s: s.name)
def scheme(request: pytest.FixtureRequest) -> Scheme:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=TIMESTAMPED, ids=lambda s: s.name)
def timed_scheme(request: pytest.FixtureRequest) -> Scheme:
    return request.param  # type: ignore[no-any-return]


def rejection(verifier: Verifier, headers: dict[str, str], body: bytes = BODY) -> str:
    with pytest.raises(SignatureError) as caught:
        verifier.verify(headers, body, NOW)
    return str(caught.value)


# -- every signed scheme -----------------------------------------------------------------


def test_a_delivery_signed_with_the_secret_verifies(scheme: Scheme) -> None:
    # Given a verifier holding the sender's secret
    secret = scheme.new_secret()
    # When the sender signs a delivery
    verified = scheme.verifier(secret).verify(scheme.sign(secret, BODY, NOW), BODY, NOW)
    # Then it verifies, carrying the id and timestamp the scheme's headers hold
    assert verified == Verified(
        scheme=scheme.name,
        event_id=scheme.event_id,
        timestamp=NOW if scheme.timestamped else None,
    )


def test_a_tampered_body_is_rejected(scheme: Scheme) -> None:
    secret = scheme.new_secret()
    headers = scheme.sign(secret, BODY, NOW)
    # When one byte of the signed body changes on the way
    tampered = BODY.replace(b'"increment": 1', b'"increment": 9')
    # Then no signature matches
    assert rejection(scheme.verifier(secret), headers, tampered) == "no signature matched"


def test_a_delivery_signed_with_another_secret_is_rejected(scheme: Scheme) -> None:
    headers = scheme.sign(scheme.new_secret(), BODY, NOW)
    assert rejection(scheme.verifier(scheme.new_secret()), headers) == "no signature matched"


def test_during_a_rotation_either_secret_verifies(scheme: Scheme) -> None:
    # Given a verifier holding the new secret and the old one
    old, new = scheme.new_secret(), scheme.new_secret()
    verifier = scheme.verifier(new, old)
    # Then deliveries signed with either verify
    for secret in (old, new):
        assert verifier.verify(scheme.sign(secret, BODY, NOW), BODY, NOW).scheme == scheme.name


def test_a_secret_removed_after_a_rotation_no_longer_verifies(scheme: Scheme) -> None:
    # Given the old secret has been dropped and a newer one added
    removed, current, next_ = (scheme.new_secret() for _ in range(3))
    verifier = scheme.verifier(current, next_)
    # Then a delivery signed with the removed secret fails
    assert rejection(verifier, scheme.sign(removed, BODY, NOW)) == "no signature matched"


def test_each_missing_signature_header_is_named(scheme: Scheme) -> None:
    secret = scheme.new_secret()
    for header in scheme.required_headers:
        headers = {k: v for k, v in scheme.sign(secret, BODY, NOW).items() if k != header}
        assert rejection(scheme.verifier(secret), headers) == f"missing header {header.lower()}"


def test_an_empty_signature_header_counts_as_missing(scheme: Scheme) -> None:
    secret = scheme.new_secret()
    headers = scheme.sign(secret, BODY, NOW) | {scheme.signature_header: "  "}
    message = rejection(scheme.verifier(secret), headers)
    assert message == f"missing header {scheme.signature_header.lower()}"


def test_a_malformed_signature_header_is_rejected(scheme: Scheme) -> None:
    secret = scheme.new_secret()
    for value in scheme.malformed_signatures:
        headers = scheme.sign(secret, BODY, NOW) | {scheme.signature_header: value}
        message = rejection(scheme.verifier(secret), headers)
        assert message.startswith(f"malformed header {scheme.signature_header.lower()}: "), value


def test_rejections_reveal_neither_the_secret_nor_the_expected_signature(scheme: Scheme) -> None:
    # Given a delivery whose body was changed after signing
    secret = scheme.new_secret()
    tampered = BODY + b" "
    expected = scheme.sign(secret, tampered, NOW)[scheme.signature_header]
    # When it is rejected
    message = rejection(scheme.verifier(secret), scheme.sign(secret, BODY, NOW), tampered)
    # Then the message holds nothing a forger could use
    for part in [secret, *expected.replace("=", ",").split(",")]:
        if len(part) > 8:
            assert part not in message


def test_header_names_are_case_insensitive(scheme: Scheme) -> None:
    secret = scheme.new_secret()
    verifier = scheme.verifier(secret)
    signed = scheme.sign(secret, BODY, NOW)
    for headers in (
        {k.upper(): v for k, v in signed.items()},
        Headers(raw=[(k.lower().encode(), v.encode()) for k, v in signed.items()]),
    ):
        assert verifier.verify(headers, BODY, NOW).event_id == scheme.event_id


# -- timestamped schemes -------------------------------------------------------------------


@pytest.mark.parametrize(("offset_s", "word"), [(-301, "past"), (301, "future")])
def test_a_timestamp_outside_the_tolerance_is_rejected(
    timed_scheme: Scheme, offset_s: int, word: str
) -> None:
    # Given a delivery correctly signed 301 s before (or after) now
    secret = timed_scheme.new_secret()
    headers = timed_scheme.sign(secret, BODY, NOW + offset_s)
    # Then the 300 s default tolerance refuses it, saying which way it is off
    message = rejection(timed_scheme.verifier(secret), headers)
    assert message == f"timestamp outside tolerance: 301 s in the {word}, tolerance 300 s"


@pytest.mark.parametrize("offset_s", [-300, -299, 0, 299, 300])
def test_a_timestamp_within_the_tolerance_is_accepted(timed_scheme: Scheme, offset_s: int) -> None:
    secret = timed_scheme.new_secret()
    headers = timed_scheme.sign(secret, BODY, NOW + offset_s)
    verified = timed_scheme.verifier(secret).verify(headers, BODY, NOW)
    assert verified.timestamp == NOW + offset_s


def test_the_tolerance_is_configurable(timed_scheme: Scheme) -> None:
    config = timed_scheme.config.model_copy(update={"tolerance_s": 10})
    secret = timed_scheme.new_secret()
    verifier = build_verifier(config, [secret])
    verifier.verify(timed_scheme.sign(secret, BODY, NOW - 10), BODY, NOW)
    with pytest.raises(SignatureError, match="tolerance 10 s"):
        verifier.verify(timed_scheme.sign(secret, BODY, NOW - 11), BODY, NOW)


# -- Stripe ---------------------------------------------------------------------------------


def test_stripe_accepts_what_the_stripe_library_accepts() -> None:
    # Given a delivery signed now by the stripe package
    secret, now = stripe_secret(), time.time()
    header = stripe.WebhookSignature.generate_signature_header(BODY.decode(), secret)
    # Then stripe's own verifier and keylane's both accept it
    assert stripe.WebhookSignature.verify_header(BODY, header, secret, tolerance=300)
    verified = build_verifier(StripeConfig(secrets_env=("S",)), [secret]).verify(
        {"Stripe-Signature": header}, BODY, now
    )
    assert verified.event_id is None


def test_stripe_during_a_secret_roll_any_v1_may_match() -> None:
    # Given Stripe signing with an expiring and a new secret, plus a test-mode v0
    old, new = stripe_secret(), stripe_secret()
    v1_old = sign_stripe(old, BODY, NOW)["Stripe-Signature"].split(",")[1]
    v1_new = sign_stripe(new, BODY, NOW)["Stripe-Signature"].split(",")[1]
    header = f"t={int(NOW)},{v1_old},{v1_new},v0=6ffbb59b2300aae63f272406069a9788598b792a"
    # Then a verifier holding only the new secret accepts it
    verifier = build_verifier(StripeConfig(secrets_env=("S",)), [new])
    assert verifier.verify({"Stripe-Signature": header}, BODY, NOW).timestamp == NOW


def test_stripe_uses_the_whsec_secret_as_written_not_base64_decoded() -> None:
    # Given a secret that is valid Standard Webhooks base64 after its prefix
    secret = svix_secret()
    headers = sign_stripe(secret, BODY, NOW)
    # Then Stripe's scheme keys on the whole text, so only the text verifies
    build_verifier(StripeConfig(secrets_env=("S",)), [secret]).verify(headers, BODY, NOW)
    raw_key = base64.b64decode(secret.removeprefix("whsec_"))
    with pytest.raises(SignatureError):
        build_verifier(StripeConfig(secrets_env=("S",)), [raw_key]).verify(headers, BODY, NOW)


# -- Standard Webhooks ----------------------------------------------------------------------


def test_standard_webhooks_known_answer_from_the_specification() -> None:
    # The example of the Standard Webhooks specification and of Svix's documentation.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
    }
    verifier = build_verifier(StandardWebhooksConfig(secrets_env=("S",)), [secret])
    verified = verifier.verify(headers, b'{"test": 2432232314}', 1614265330.0)
    assert verified.event_id == "msg_p5jXN8AQM9LWM0D4loKWxJek"


def test_standard_webhooks_accepts_what_the_package_accepts() -> None:
    secret, now = svix_secret(), time.time()
    headers = sign_svix(secret, BODY, now)
    Webhook(secret).verify(BODY, headers, json_parse=False)
    build_verifier(StandardWebhooksConfig(secrets_env=("S",)), [secret]).verify(headers, BODY, now)


def test_standard_webhooks_signs_the_message_id() -> None:
    # Given a delivery whose id was changed (to slip past dedupe)
    secret = svix_secret()
    headers = sign_svix(secret, BODY, NOW) | {"webhook-id": "msg_2"}
    verifier = build_verifier(StandardWebhooksConfig(secrets_env=("S",)), [secret])
    assert rejection(verifier, headers) == "no signature matched"


def test_standard_webhooks_finds_v1_among_several_signatures() -> None:
    # Given a sender rotating its secret, also sending an Ed25519 (v1a) signature
    old, new = svix_secret(), svix_secret()
    signatures = [sign_svix(s, BODY, NOW)["webhook-signature"] for s in (old, new)]
    headers = sign_svix(new, BODY, NOW) | {
        "webhook-signature": " ".join(["v1a,aGVsbG8=", *signatures])
    }
    verifier = build_verifier(StandardWebhooksConfig(secrets_env=("S",)), [new])
    assert verifier.verify(headers, BODY, NOW).event_id == "msg_1"


@pytest.mark.parametrize(
    "value", ["soon", "1.7e9", "-1700000000", "1700000000.5", "\u0661\u0667\u0660\u0660"]
)
def test_standard_webhooks_rejects_a_timestamp_that_is_not_whole_seconds(value: str) -> None:
    secret = svix_secret()
    headers = sign_svix(secret, BODY, NOW) | {"webhook-timestamp": value}
    verifier = build_verifier(StandardWebhooksConfig(secrets_env=("S",)), [secret])
    assert rejection(verifier, headers).startswith("malformed header webhook-timestamp: ")


def test_standard_webhooks_secrets_are_handled_like_the_package() -> None:
    # Given secrets the package accepts: raw key bytes, and base64 without padding
    key = os.urandom(32)
    unpadded = "whsec_" + base64.b64encode(os.urandom(31)).decode().rstrip("=")
    for secret in (key, unpadded):
        signed_at = datetime.fromtimestamp(NOW, tz=UTC)
        headers = {
            "webhook-id": "msg_1",
            "webhook-timestamp": str(int(NOW)),
            "webhook-signature": Webhook(secret).sign("msg_1", signed_at, BODY.decode()),
        }
        # Then keylane derives the same key from them
        verifier = build_verifier(StandardWebhooksConfig(secrets_env=("S",)), [secret])
        assert verifier.verify(headers, BODY, NOW).event_id == "msg_1"


# -- GitHub, Shopify, generic HMAC, none -----------------------------------------------------


def test_github_known_answer_from_its_documentation() -> None:
    # The example of GitHub's "Validating webhook deliveries" page.
    digest = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    verifier = build_verifier(GithubConfig(secrets_env=("S",)), ["It's a Secret to Everybody"])
    verified = verifier.verify({"X-Hub-Signature-256": f"sha256={digest}"}, b"Hello, World!", NOW)
    # Without X-GitHub-Delivery the delivery still verifies: that header is not signed
    assert verified == Verified(scheme="github", event_id=None, timestamp=None)


@pytest.mark.parametrize(
    ("algorithm", "encoding"),
    [("sha1", "hex"), ("sha256", "base64"), ("sha512", "hex"), ("sha512", "base64")],
)
def test_generic_hmac_algorithms_and_encodings(algorithm: str, encoding: str) -> None:
    # Given a sender signing the bare body, without timestamp
    config = parse_verify_config(
        {
            "scheme": "hmac",
            "secrets_env": "S",
            "header": "X-Sig",
            "algorithm": algorithm,
            "encoding": encoding,
        }
    )
    secret = plain_secret()
    digest = hmac.new(secret.encode(), BODY, algorithm).digest()
    text = digest.hex() if encoding == "hex" else base64.b64encode(digest).decode()
    verifier = build_verifier(config, [secret])
    assert verifier.verify({"x-sig": text}, BODY, NOW) == Verified("hmac", None, None)
    assert rejection(verifier, {"x-sig": text}, BODY + b"\n") == "no signature matched"


def test_generic_hmac_can_sign_the_event_id() -> None:
    config = FORMS.model_copy(update={"signed_payload": "{event_id}:{timestamp}:{body}"})
    secret = plain_secret()
    signed = f"form-1:{int(NOW)}:".encode() + BODY
    headers = sign_forms(secret, BODY, NOW) | {
        "X-Forms-Signature": "sha256=" + hmac.new(secret.encode(), signed, "sha256").hexdigest()
    }
    verifier = build_verifier(HmacConfig.model_validate(config.model_dump()), [secret])
    assert verifier.verify(headers, BODY, NOW).event_id == "form-1"
    forged = headers | {"X-Forms-Event": "form-2"}
    assert rejection(verifier, forged) == "no signature matched"


def test_generic_hmac_template_literals_are_not_placeholders() -> None:
    # Given a template whose literal text happens to spell a placeholder's name
    config = HmacConfig(secrets_env=("S",), header="X-Sig", signed_payload="timestamp{body}")
    secret = plain_secret()
    digest = hmac.new(secret.encode(), b"timestamp" + BODY, "sha256").hexdigest()
    # Then it is signed as text, and needs no timestamp header
    verifier = build_verifier(config, [secret])
    assert verifier.verify({"X-Sig": digest}, BODY, NOW) == Verified("hmac", None, None)


def test_the_none_scheme_verifies_anything() -> None:
    verifier = build_verifier(NoneConfig(), [])
    assert verifier.verify({}, b"anything", NOW) == Verified("none", None, None)


# -- configuration -------------------------------------------------------------------------


SOURCES_TOML = """
stripe = {scheme = "stripe", secrets_env = ["STRIPE_WHSEC", "STRIPE_WHSEC_OLD"], tolerance_s = 300}
svix = {scheme = "standard_webhooks", secrets_env = ["SVIX_SECRET"], tolerance_s = 120}
github = {scheme = "github", secrets_env = "GITHUB_SECRET"}
shopify = {scheme = "shopify", secrets_env = ["SHOPIFY_SECRET"]}
demo = {scheme = "none"}
forms = {scheme = "hmac", secrets_env = ["FORMS_SECRET"], header = "X-Forms-Signature", \
prefix = "sha256=", timestamp_header = "X-Forms-Timestamp", \
signed_payload = "{timestamp}.{body}", event_id_header = "X-Forms-Event"}
"""


def test_configurations_read_from_toml() -> None:
    tables = tomllib.loads(SOURCES_TOML)
    configs = {name: parse_verify_config(table) for name, table in tables.items()}
    assert configs["stripe"] == StripeConfig(secrets_env=("STRIPE_WHSEC", "STRIPE_WHSEC_OLD"))
    assert configs["svix"] == StandardWebhooksConfig(secrets_env=("SVIX_SECRET",), tolerance_s=120)
    assert configs["github"] == GithubConfig(secrets_env=("GITHUB_SECRET",))
    assert configs["shopify"] == ShopifyConfig(secrets_env=("SHOPIFY_SECRET",))
    assert configs["demo"] == NoneConfig()
    assert configs["forms"] == FORMS


@pytest.mark.parametrize(
    "table",
    [
        {"scheme": "md5", "secrets_env": ["S"]},
        {"secrets_env": ["S"]},
        {"scheme": "stripe"},
        {"scheme": "stripe", "secrets_env": []},
        {"scheme": "stripe", "secrets_env": ["not a name"]},
        {"scheme": "stripe", "secrets_env": ["S"], "secret": "whsec_inline"},
        {"scheme": "stripe", "secrets_env": ["S"], "tolerance_s": 0},
        {"scheme": "none", "secrets_env": ["S"]},
        {"scheme": "hmac", "secrets_env": ["S"], "header": "X Sig"},
        {"scheme": "hmac", "secrets_env": ["S"], "header": "X", "algorithm": "md5"},
        {"scheme": "hmac", "secrets_env": ["S"], "header": "X", "signed_payload": "{timestamp}"},
        {"scheme": "hmac", "secrets_env": ["S"], "header": "X", "signed_payload": "{body}{body}"},
        {"scheme": "hmac", "secrets_env": ["S"], "header": "X", "signed_payload": "{id}.{body}"},
        {
            "scheme": "hmac",
            "secrets_env": ["S"],
            "header": "X",
            "signed_payload": "{timestamp}.{body}",
        },
        {"scheme": "hmac", "secrets_env": ["S"], "header": "X", "timestamp_header": "X-T"},
        {
            "scheme": "hmac",
            "secrets_env": ["S"],
            "header": "X",
            "signed_payload": "{event_id}{body}",
        },
    ],
)
def test_unusable_configurations_are_refused(table: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        parse_verify_config(table)


def test_secrets_are_read_from_the_named_variables_in_order() -> None:
    config = StripeConfig(secrets_env=("STRIPE_WHSEC", "STRIPE_WHSEC_OLD"))
    environ = {"STRIPE_WHSEC": "whsec_new", "STRIPE_WHSEC_OLD": "whsec_old", "OTHER": "x"}
    secrets = load_secrets(config, environ)
    assert [s.get_secret_value() for s in secrets] == ["whsec_new", "whsec_old"]
    assert load_secrets(NoneConfig(), environ) == []


@pytest.mark.parametrize(
    ("environ", "problem"),
    [
        ({"STRIPE_WHSEC": "whsec_present"}, "STRIPE_WHSEC_OLD is not set"),
        ({"STRIPE_WHSEC": "whsec_present", "STRIPE_WHSEC_OLD": ""}, "STRIPE_WHSEC_OLD is empty"),
        (
            {"STRIPE_WHSEC": "whsec_present", "STRIPE_WHSEC_OLD": "whsec_pasted\n"},
            "STRIPE_WHSEC_OLD has leading or trailing whitespace",
        ),
    ],
)
def test_an_unusable_secret_variable_is_named_but_not_shown(
    environ: dict[str, str], problem: str
) -> None:
    config = StripeConfig(secrets_env=("STRIPE_WHSEC", "STRIPE_WHSEC_OLD"))
    with pytest.raises(ConfigError, match=problem) as caught:
        load_secrets(config, environ)
    assert "whsec_p" not in str(caught.value)


@pytest.mark.parametrize(
    ("config", "secrets", "problem"),
    [
        (StripeConfig(secrets_env=("S",)), [], "needs at least one secret"),
        (GithubConfig(secrets_env=("S",)), ["ok", ""], "secret #2 for the github signature"),
        (StandardWebhooksConfig(secrets_env=("S",)), ["whsec_"], "secret #1 .* is empty"),
        (StandardWebhooksConfig(secrets_env=("S",)), ["whsec_ëtoile"], "is not base64"),
        (NoneConfig(), ["whsec_x"], "takes no secrets"),
    ],
)
def test_a_verifier_is_not_built_from_unusable_secrets(
    config: VerifyConfig, secrets: list[str], problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem) as caught:
        build_verifier(config, secrets)
    assert "toile" not in str(caught.value)


def test_secrets_never_appear_in_reprs(scheme: Scheme) -> None:
    # Given a verifier built from the environment
    secret = scheme.new_secret()
    environ = dict.fromkeys(scheme.config.secrets_env, secret)  # type: ignore[union-attr]
    verifier = verifier_from_environ(scheme.config, environ)
    loaded = load_secrets(scheme.config, environ)
    # Then nothing printable about it shows the secret (or its UTF-8 bytes)
    for shown in (repr(verifier), str(verifier), repr(scheme.config), repr(loaded), str(loaded)):
        assert secret not in shown
        assert repr(secret.encode()) not in shown
    assert isinstance(loaded[0], SecretStr)

"""Property-based fuzzing of the receiver (in process, real Redis): whatever a sender sends,
the answer is never a 5xx, and a 4xx leaves Redis exactly as it was."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from keylane.producers.receiver_app import create_receiver
from keylane.routing.contract.settings import Settings
from keylane.routing.contract.sources import parse_sources
from tests.conftest import delete_namespace, fast_settings

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

SOURCES = """
[sources.demo]
[sources.mapped]
format = "mapped"
record_key = "acct:{body:data.account}"
event_type = "body:type"
[sources.mapped.on."*"]
total = { increment = "body:data.amount" }
tags = { add = "body:data.tag" }
[sources.signed]
verify = { scheme = "github", secrets_env = ["FUZZ_SECRET"] }
"""

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
ops = st.sampled_from(["set", "unset", "increment", "append", "add", "remove", "multiply", ""])
changes = st.dictionaries(
    st.text(max_size=12), st.dictionaries(ops, json_values, max_size=2), max_size=4
)
envelopes = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.text(max_size=300), st.integers(), st.none()),
        "type": st.one_of(st.text(max_size=20), st.integers()),
        "record_key": st.one_of(st.text(max_size=600), st.integers(), st.none()),
        "changes": st.one_of(changes, json_values),
        "extra": json_values,
    },
)
mapped = st.fixed_dictionaries(
    {
        "type": st.text(max_size=10),
        "data": st.fixed_dictionaries(
            {}, optional={"account": json_values, "amount": json_values, "tag": json_values}
        ),
    }
)
bodies = st.one_of(
    envelopes.map(lambda v: json.dumps(v).encode()),
    mapped.map(lambda v: json.dumps(v).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
)
media_types = st.sampled_from(
    [
        "application/json",
        "application/vnd.x+json; charset=utf-8",
        "text/plain",
        "",
        "application/x-www-form-urlencoded",
    ]
)
source_names = st.sampled_from(["demo", "mapped", "signed", "nope", "DEMO", "..", "demo%00"])
header_sets = st.dictionaries(
    st.sampled_from(["x-hub-signature-256", "webhook-id", "x-github-delivery", "stripe-signature"]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=80),
    max_size=3,
)


#: The Redis database this test keeps its namespace in: each example compares every key
#: of the namespace before and after, and a SCAN reads the whole database it runs in, so
#: a database of its own keeps that to this test's keys (the other tests share db 0).
FUZZ_DB = 7


@pytest.fixture
def settings(redis_url: str, namespace: str, store_url: str, tmp_path: Path) -> Iterator[Settings]:
    """The usual test settings, in a Redis database of this test's own (its namespace's
    keys deleted afterwards, as ever)."""
    url = f"{redis_url.rsplit('/', 1)[0]}/{FUZZ_DB}"
    yield fast_settings(url, namespace, store_url, tmp_path / "data")
    delete_namespace(url, namespace)


@pytest.fixture
def client(settings: Settings, tmp_path: Path) -> Iterator[TestClient]:
    sources = parse_sources(SOURCES)
    app = create_receiver(settings, sources, environ={"FUZZ_SECRET": "s3cret"})
    with TestClient(app, raise_server_exceptions=True) as test_client:
        yield test_client


def _redis_state(settings: Settings) -> dict[str, Any]:
    client = redis.Redis.from_url(settings.redis_dsn())
    state: dict[str, Any] = {}
    door = settings.keys.door("")
    for key in client.scan_iter(match=f"{settings.namespace}:*"):
        if key.decode().startswith(door):
            continue  # a refusal kept at the door (ops/docs/deliveries.md): no mark, no event
        state[key.decode()] = client.dump(key)
    client.close()
    return state


@hypothesis_settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(source=source_names, body=bodies, media_type=media_types, headers=header_sets)
def test_no_5xx_and_no_state_change_on_4xx(
    client: TestClient,
    settings: Settings,
    source: str,
    body: bytes,
    media_type: str,
    headers: dict[str, str],
) -> None:
    before = _redis_state(settings)
    answer = client.post(
        f"/webhooks/{source}", content=body, headers={"content-type": media_type, **headers}
    )
    assert answer.status_code < 500, answer.text
    if 400 <= answer.status_code < 500 and answer.status_code != 409:
        assert answer.json()["error"]
        assert _redis_state(settings) == before

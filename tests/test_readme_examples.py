"""The worked examples of the docs' "Destinations and tasks" page (ops/docs/destinations.md),
run as written, read from the page: the batch task (``@keylane.task(..., batch=20,
debounce_ms=2000)`` and its ``[sources.crm_edits]``) against the example CRM keylane ships
(ops/examples/crm.py, started by the page's own command line), and the n8n forward
(``[sources.typeform]`` with ``[destinations.n8n]``) against a real local HTTP server standing
in for the workflow; with real worker and receiver processes. Only URLs and ports are the
test's."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path

import httpx
import pytest

from tests.support.notion import HookServer
from tests.support.readme import example_crm, install_page_app, page_block
from tests.support.stack import Stack, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)]

PAGE = "destinations.md"


def test_the_readme_batch_task_makes_one_call_for_a_burst_of_edits(
    stack: Stack, tmp_path: Path
) -> None:
    # Given the example CRM, started by the page's command line (on a port of the test's)
    with example_crm(
        page_block(PAGE, "python -m keylane.ops.examples.crm"), tmp_path / "crm.log"
    ) as crm:
        # And the page's batch task and its source as written
        install_page_app(stack, tmp_path, PAGE, "myapp.edits", "[sources.crm_edits]", CRM_URL=crm)
        stack.worker()
        stack.receiver()
        stack.wait_all_owned()
        # When a contact is edited five times in a second, and another contact once
        for edit in range(5):
            body = {"id": f"ada-{edit}", "email": "ada@example.com", "name": "Ada", "edit": edit}
            assert stack.post(body, source="crm_edits").status_code == 202
        body = {"id": "bob-0", "email": "bob@example.com", "name": "Bob", "edit": 0}
        assert stack.post(body, source="crm_edits").status_code == 202
        stack.wait_journal(6)

        # Then each contact cost one write (the CRM's version 1: created, never updated),
        # with its latest edit
        def contacts(email: str) -> list[dict[str, object]]:
            found = httpx.post(f"{crm}/contacts/search", json={"email": email}).json()
            return [{k: c[k] for k in ("name", "edit", "version")} for c in found["results"]]

        assert contacts("ada@example.com") == [{"name": "Ada", "edit": 4, "version": 1}]
        assert contacts("bob@example.com") == [{"name": "Bob", "edit": 0, "version": 1}]
        assert len(httpx.get(f"{crm}/contacts").json()["results"]) == 3 + 2  # the seed and two


def _typeform_signature(secret: str, body: bytes) -> str:
    """How Typeform signs a delivery: base64 of HMAC-SHA256 over the body, prefixed."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).digest()
    return "sha256=" + base64.b64encode(digest).decode()


def test_the_readme_n8n_forward_calls_the_workflow_once_per_event_in_order(
    stack: Stack, tmp_path: Path
) -> None:
    signing = "whsec_" + base64.b64encode(b"n8n-signing-secret-32-bytes-long").decode()
    hook = HookServer(secret=signing).start()
    try:
        # Given the page's Typeform source and n8n destination as written, the workflow's
        # URL that of a local server which checks keylane's signature
        example = page_block(PAGE, "[sources.typeform]")
        url = "https://n8n.example.com/webhook/3f1c0d1e-leads"
        assert url in example
        sources = tmp_path / "sources.toml"
        sources.write_text(example.replace(url, f"{hook.url}/hook"))
        stack.settings = stack.settings.model_copy(update={"sources_file": sources})
        stack.extra_env.update(
            TYPEFORM_SECRET="typeform-secret",
            N8N_SIGNING_SECRET=signing,
            N8N_API_KEY="n8n-api-key",
        )
        stack.worker()
        stack.receiver()
        stack.wait_all_owned()
        # When Typeform sends three answers of one lead, one of them twice, and one of another
        sent = []
        for n, email in enumerate(["ada@x.io", "ada@x.io", "bob@x.io", "ada@x.io"]):
            body = json.dumps(
                {"event_id": f"tf-{n}", "form_response": {"hidden": {"email": email}, "n": n}},
                indent=1,  # bytes that a re-encoding would not keep
            ).encode()
            sent.append(body)
            for _ in range(2 if n == 1 else 1):
                headers = {"Typeform-Signature": _typeform_signature("typeform-secret", body)}
                answer = stack.post(body, source="typeform", **headers)
                assert answer.status_code in (200, 202), answer.text
        wait_until(lambda: len(hook.calls) >= 4, 60, "four calls", on_timeout=stack.logs)
        stack.wait_journal(4)
        # Then the workflow was called once per event, in order per lead, never twice at
        # once for a lead, with the bytes that came and the page's headers
        assert hook.status_counts == {200: 4}
        assert [c.body["event_id"] for c in hook.calls if c.key != "typeform/tf-2"] == [
            "tf-0",
            "tf-1",
            "tf-3",
        ]
        assert hook.overlaps == 0
        for n, body in enumerate(sent):
            headers = hook.headers[f"typeform/tf-{n}"]
            assert headers["x-api-key"] == "n8n-api-key"
            assert headers["webhook-id"] == f"typeform/tf-{n}"
            assert headers["keylane-source"] == "typeform"
            assert headers["keylane-record-key"] == ("lead:bob@x.io" if n == 2 else "lead:ada@x.io")
            assert hook.bodies[f"typeform/tf-{n}"] == body
    finally:
        hook.stop()

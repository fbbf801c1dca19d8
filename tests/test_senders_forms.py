"""Form and scheduling senders as they send (issue 47): Jotform, Mailchimp, Google Forms
(through Apps Script), Typeform and Calendly, each delivery built by the provider's
published example (none has a Python SDK that builds one; /work/notes/providers.md names
the sources), through a real receiver and worker: applied to its record, sent again a
duplicate, a forgery a 401 that records nothing, Mailchimp's GET check answered."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest

from tests.support.senders import (
    PUBLIC_URL,
    applied,
    get,
    refused_changes_nothing,
    replayed,
    send,
    sender_deployment,
    settled,
)
from tests.support.stack import Stack

JOTFORM_KEY = "jf-" + "3b0c1e5d9a7f42c8"
MAILCHIMP_KEY = "mc-" + "8d2f7a4b1c6e9053"
FORMS_TOKEN = "gf-" + "5e1a9c3d7b2f4086"
TYPEFORM_SECRET = "typeform-secret-6a2d"
CALENDLY_KEY = "calendly-signing-key-0c7e"
SECRETS = {
    "JOTFORM_KEY": JOTFORM_KEY,
    "MAILCHIMP_KEY": MAILCHIMP_KEY,
    "GOOGLE_FORMS_TOKEN": FORMS_TOKEN,
    "TYPEFORM_SECRET": TYPEFORM_SECRET,
    "CALENDLY_SIGNING_KEY": CALENDLY_KEY,
}

SOURCES = """
[sources.jotform]
verify = {scheme = "jotform", secrets_env = ["JOTFORM_KEY"]}
format = "mapped"
record_key = "lead:{body:rawRequest.q4_email}"
on.event = {name = {set = "body:rawRequest.q3_name.first"}, form = {set = "body:formID"}}

[sources.mailchimp]
verify = {scheme = "mailchimp", secrets_env = ["MAILCHIMP_KEY"]}
format = "mapped"
record_key = "member:{body:data.email}"
on.subscribe = {status = {set = "subscribed"}, first_name = {set = "body:data.merges.FNAME"}}
on.profile.first_name = {set = "body:data.merges.FNAME"}
on.profile.interests = {set = "body:data.merges.INTERESTS"}
on.unsubscribe = {status = {set = "unsubscribed"}}

[sources.google_forms]
verify = {scheme = "google_forms", secrets_env = ["GOOGLE_FORMS_TOKEN"]}
format = "mapped"
record_key = "lead:{body:email}"
on.event.name = {set = "body:answers.Name"}
on.event.company = {set = "body:answers.Company"}
on.event.submissions = {increment = 1}

[sources.google_forms_url]
verify = {scheme = "google_forms", secrets_env = ["GOOGLE_FORMS_TOKEN"], token = "query:token"}
format = "mapped"
record_key = "lead:{body:email}"
on.event = {name = {set = "body:answers.Name"}, submissions = {increment = 1}}

[sources.typeform]
verify = {scheme = "typeform", secrets_env = ["TYPEFORM_SECRET"]}
format = "mapped"
record_key = "lead:{body:form_response.hidden.email}"
on.form_response.score = {set = "body:form_response.calculated.score"}
on.form_response.responses = {increment = 1}

[sources.calendly]
verify = {scheme = "calendly", secrets_env = ["CALENDLY_SIGNING_KEY"]}
format = "mapped"
record_key = "invitee:{body:payload.email}"
on."invitee.created" = {bookings = {add = "body:payload.event"}, name = {set = "body:payload.name"}}
on."invitee.canceled" = {bookings = {remove = "body:payload.event"}}
"""


@pytest.fixture(scope="module")
def stack(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The module's deployment (each test uses records of its own)."""
    with sender_deployment(
        redis_url, tmp_path_factory.mktemp("forms"), SOURCES, SECRETS
    ) as running:
        yield running


def _email(name: str) -> str:
    return f"{name}.{uuid.uuid4().hex[:8]}@example.com"


# -- Jotform ------------------------------------------------------------------------------


def _multipart(fields: dict[str, str]) -> tuple[bytes, str]:
    """``fields`` as multipart/form-data the way PHP's curl writes it (Jotform's sender): a
    boundary of its own for every request."""
    boundary = "------------------------" + secrets.token_hex(8)
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    ]
    body = "".join(parts) + f"--{boundary}--\r\n"
    return body.encode(), f"multipart/form-data; boundary={boundary}"


def _submission(email: str, first: str) -> dict[str, str]:
    """A Jotform webhook's fields, as a captured submission shows them: the answers as
    JSON text in rawRequest."""
    form = "70936128142151"
    answers = {
        "slug": f"submit/{form}/",
        "q3_name": {"first": first, "last": "Lovelace"},
        "q4_email": email,
        "q5_company": "Analytical Engines",
        "event_id": f"1510165948969_{form}_FE1smSr",
    }
    return {
        "formID": form,
        "submissionID": str(uuid.uuid4().int)[:19],
        "webhookURL": f"{PUBLIC_URL}/webhooks/jotform?key=...",
        "ip": "173.91.0.10",
        "formTitle": "Development Support",
        "pretty": f"Name:{first} Lovelace, E-mail:{email}, Company:Analytical Engines",
        "username": "acme",
        "rawRequest": json.dumps(answers),
        "type": "WEB",
    }


def test_jotform_multipart_with_its_answers_as_json(stack: Stack) -> None:
    email = _email("ada")
    fields = _submission(email, "Ada")
    key = urlencode({"key": JOTFORM_KEY})
    # Given a submission posted as multipart/form-data to the URL with its key
    body, content_type = _multipart(fields)
    answer = send(stack, "jotform", body, {}, query=key, content_type=content_type)
    assert answer.status_code == 202, answer.text
    # When it is posted again (a new request: a new multipart boundary)
    again, again_type = _multipart(fields)
    assert again != body
    retry = send(stack, "jotform", again, {}, query=key, content_type=again_type)
    # Then it is a duplicate, not an id reused with another body
    assert replayed(retry), retry.text
    # And its answers, read from rawRequest, are applied to the lead
    applied(stack, f"lead:{email}", {"name": "Ada", "form": "70936128142151"})
    # And without the key, or with another, nothing is recorded
    forged, forged_type = _multipart(_submission(email, "Eve"))
    refused_changes_nothing(
        stack,
        {
            "no key": lambda: send(stack, "jotform", forged, {}, content_type=forged_type),
            "wrong key": lambda: send(
                stack, "jotform", forged, {}, query="key=guess", content_type=forged_type
            ),
        },
    )


# -- Mailchimp ----------------------------------------------------------------------------


def _mailchimp(kind: str, email: str, **merges: str) -> bytes:
    """A Mailchimp audience webhook as its guide shows it: a form with bracketed keys."""
    fields = {
        "type": kind,
        "fired_at": "2009-03-26 21:35:57",
        "data[id]": hashlib.md5(email.encode()).hexdigest()[:10],
        "data[list_id]": "a6b5da1054",
        "data[email]": email,
        "data[email_type]": "html",
        **{f"data[merges][{name}]": value for name, value in merges.items()},
        "data[ip_opt]": "10.20.10.30",
        "data[ip_signup]": "10.20.10.30",
    }
    return urlencode(fields).encode()


FORM = "application/x-www-form-urlencoded"


def test_mailchimp_get_check_then_bracketed_forms(stack: Stack) -> None:
    key = urlencode({"key": MAILCHIMP_KEY})
    # Given the GET Mailchimp sends when the webhook is created: 200 with the URL's key
    before = settled(stack)
    assert get(stack, "mailchimp", key).status_code == 200
    # And 401 without it, recording nothing either way
    assert get(stack, "mailchimp").status_code == 401
    assert get(stack, "mailchimp", "key=guess").status_code == 401
    assert settled(stack) == before
    email = _email("ann")
    subscribe = _mailchimp("subscribe", email, EMAIL=email, FNAME="Ann", LNAME="API")
    profile = _mailchimp("profile", email, EMAIL=email, FNAME="Annie", INTERESTS="Group1,Group2")
    # When a member subscribes and updates her profile, and Mailchimp retries the update
    for body in (subscribe, profile, profile):
        answer = send(stack, "mailchimp", body, {}, query=key, content_type=FORM)
        assert answer.status_code in (200, 202), answer.text
    # Then the retry was a duplicate, and the member's record has both, once
    assert replayed(answer)
    applied(
        stack,
        f"member:{email}",
        {"status": "subscribed", "first_name": "Annie", "interests": "Group1,Group2"},
    )
    refused_changes_nothing(
        stack,
        {
            "no key": lambda: send(stack, "mailchimp", subscribe, {}, content_type=FORM),
            "wrong key": lambda: send(
                stack, "mailchimp", subscribe, {}, query="key=guess", content_type=FORM
            ),
        },
    )


# -- Google Forms (Apps Script) -----------------------------------------------------------

#: The Apps Script a form's owner adds (Extensions > Apps Script), with an installable
#: "On form submit" trigger and the script properties KEYLANE_URL and KEYLANE_TOKEN.
APPS_SCRIPT = """
function onFormSubmit(e) {
  var props = PropertiesService.getScriptProperties();
  var answers = {};
  e.response.getItemResponses().forEach(function (answer) {
    answers[answer.getItem().getTitle()] = answer.getResponse();
  });
  UrlFetchApp.fetch(props.getProperty("KEYLANE_URL"), {
    method: "post",
    contentType: "application/json",
    headers: {"X-Keylane-Token": props.getProperty("KEYLANE_TOKEN")},
    payload: JSON.stringify({
      response_id: e.response.getId(),
      form_id: e.source.getId(),
      submitted_at: e.response.getTimestamp().toISOString(),
      email: e.response.getRespondentEmail(),
      answers: answers,
    }),
  });
}
"""

#: Google's objects as the trigger hands them over (FormApp's event, its form response,
#: the script's properties), and a UrlFetchApp that prints the request it is asked for.
_APPS_SCRIPT_RUNTIME = """
const given = JSON.parse(process.env.APPS_SCRIPT_EVENT);
const PropertiesService = {getScriptProperties: () => ({getProperty: (n) => given.properties[n]})};
const UrlFetchApp = {fetch: (url, params) => console.log(JSON.stringify({url, params}))};
const e = {
  source: {getId: () => given.form_id},
  response: {
    getId: () => given.response_id,
    getTimestamp: () => new Date(given.submitted_at),
    getRespondentEmail: () => given.email,
    getItemResponses: () => Object.entries(given.answers).map(([title, value]) => ({
      getItem: () => ({getTitle: () => title}),
      getResponse: () => value,
    })),
  },
};
"""


def _apps_script_fetch(script: str, properties: dict[str, str], email: str) -> dict[str, Any]:
    """The request ``script``'s onFormSubmit asks UrlFetchApp for on a form response
    (run by node, Google's services in its place)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (it runs the Apps Script)")
    given = {
        "properties": properties,
        "form_id": "1FAIpQLSd-form",
        "response_id": "2_ABaOnud" + uuid.uuid4().hex[:20],
        "submitted_at": "2024-05-01T10:01:00.000Z",
        "email": email,
        "answers": {"Name": "Ada Lovelace", "Company": "Analytical Engines"},
    }
    program = _APPS_SCRIPT_RUNTIME + script + "\nonFormSubmit(e);\n"
    done = subprocess.run(
        [node, "-e", program],
        env={**os.environ, "APPS_SCRIPT_EVENT": json.dumps(given)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    fetched: dict[str, Any] = json.loads(done.stdout)
    return fetched


def _as_url_fetch_app_sends(stack: Stack, fetched: dict[str, Any]) -> Any:
    """POST what the script asked UrlFetchApp for: its URL (the receiver's path), method,
    content type, headers and payload."""
    params = fetched["params"]
    assert params["method"] == "post"
    url = urlsplit(fetched["url"])
    source = url.path.rpartition("/")[2]
    return send(
        stack,
        source,
        params["payload"].encode(),
        params.get("headers", {}),
        query=url.query,
        content_type=params["contentType"],
    )


def test_google_forms_apps_script_with_its_token_in_a_header(stack: Stack) -> None:
    email = _email("ada")
    properties = {
        "KEYLANE_URL": f"{PUBLIC_URL}/webhooks/google_forms",
        "KEYLANE_TOKEN": FORMS_TOKEN,
    }
    # Given the request the Apps Script makes on a form response
    fetched = _apps_script_fetch(APPS_SCRIPT, properties, email)
    # When it reaches keylane, and the same response is sent again (the script run again)
    first = _as_url_fetch_app_sends(stack, fetched)
    assert first.status_code == 202, first.text
    assert replayed(_as_url_fetch_app_sends(stack, fetched))
    # Then the response is applied to the respondent's record, once
    applied(
        stack,
        f"lead:{email}",
        {"name": "Ada Lovelace", "company": "Analytical Engines", "submissions": 1},
    )
    # And with another token, or none, nothing is recorded
    wrong = _apps_script_fetch(APPS_SCRIPT, {**properties, "KEYLANE_TOKEN": "guess"}, email)
    bare = json.loads(json.dumps(fetched))
    bare["params"]["headers"] = {}
    refused_changes_nothing(
        stack,
        {
            "wrong token": lambda: _as_url_fetch_app_sends(stack, wrong),
            "no token": lambda: _as_url_fetch_app_sends(stack, bare),
        },
    )


def test_google_forms_apps_script_with_its_token_in_the_url(stack: Stack) -> None:
    # Given the same script with the token in the URL instead of a header
    script = APPS_SCRIPT.replace(
        '    headers: {"X-Keylane-Token": props.getProperty("KEYLANE_TOKEN")},\n', ""
    )
    assert "X-Keylane-Token" not in script
    email = _email("grace")
    url = f"{PUBLIC_URL}/webhooks/google_forms_url?" + urlencode({"token": FORMS_TOKEN})
    fetched = _apps_script_fetch(script, {"KEYLANE_URL": url}, email)
    # Then it is accepted, and applied once
    assert _as_url_fetch_app_sends(stack, fetched).status_code == 202
    assert replayed(_as_url_fetch_app_sends(stack, fetched))
    applied(stack, f"lead:{email}", {"name": "Ada Lovelace", "submissions": 1})
    wrong = json.loads(json.dumps(fetched))
    wrong["url"] = url.replace(FORMS_TOKEN, "guess")
    refused_changes_nothing(stack, {"wrong token": lambda: _as_url_fetch_app_sends(stack, wrong)})


# -- Typeform -----------------------------------------------------------------------------


def _typeform(
    payload: dict[str, object], secret: str = TYPEFORM_SECRET
) -> tuple[bytes, dict[str, str]]:
    """A Typeform webhook signed as Typeform documents it: ``sha256=`` base64 HMAC-SHA256
    of the body under the webhook's secret."""
    body = json.dumps(payload).encode()
    digest = base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()
    return body, {"Typeform-Signature": f"sha256={digest}"}


def _form_response(email: str, score: int) -> dict[str, object]:
    return {
        "event_id": "01H" + uuid.uuid4().hex[:23].upper(),
        "event_type": "form_response",
        "form_response": {
            "form_id": "lT4Z3j",
            "token": uuid.uuid4().hex,
            "landed_at": "2024-05-01T10:00:00Z",
            "submitted_at": "2024-05-01T10:01:00Z",
            "hidden": {"email": email},
            "calculated": {"score": score},
            "definition": {"id": "lT4Z3j", "title": "Lead qualification", "fields": []},
            "answers": [
                {
                    "type": "choice",
                    "choice": {"label": "Enterprise"},
                    "field": {"id": "Fxyz", "type": "multiple_choice", "ref": "plan"},
                }
            ],
        },
    }


def test_typeform_responses_signed_as_documented(stack: Stack) -> None:
    email = _email("ann")
    response = _form_response(email, 7)
    body, headers = _typeform(response)
    assert send(stack, "typeform", body, headers).status_code == 202
    # Typeform retries with the same body and signature
    assert replayed(send(stack, "typeform", body, headers))
    applied(stack, f"lead:{email}", {"score": 7, "responses": 1})
    hex_digest = hmac.new(TYPEFORM_SECRET.encode(), body, hashlib.sha256).hexdigest()
    refused_changes_nothing(
        stack,
        {
            "wrong secret": lambda: send(stack, "typeform", *_typeform(response, "guess")),
            "tampered": lambda: send(
                stack, "typeform", body.replace(b'"score": 7', b'"score": 9'), headers
            ),
            "hex, not base64": lambda: send(
                stack, "typeform", body, {"Typeform-Signature": f"sha256={hex_digest}"}
            ),
            "no signature": lambda: send(stack, "typeform", body, {}),
        },
    )


# -- Calendly -----------------------------------------------------------------------------


def _calendly(
    payload: dict[str, object], at: int | None = None, key: str = CALENDLY_KEY
) -> tuple[bytes, dict[str, str]]:
    """A Calendly webhook signed as Calendly documents it: ``t=<s>,v1=<hex HMAC-SHA256 of
    "<t>.<body>">`` under the subscription's signing key."""
    body = json.dumps(payload).encode()
    t = str(at or int(time.time()))
    digest = hmac.new(key.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return body, {"Calendly-Webhook-Signature": f"t={t},v1={digest}"}


def _invitee(kind: str, email: str, event: str, invitee: str) -> dict[str, object]:
    return {
        "created_at": "2024-05-01T10:00:00.000000Z",
        "created_by": "https://api.calendly.com/users/AAAAAAAAAAAAAAAA",
        "event": kind,
        "payload": {
            "uri": f"{event}/invitees/{invitee}",
            "email": email,
            "name": "Ann Example",
            "status": "active" if kind == "invitee.created" else "canceled",
            "event": event,
            "rescheduled": kind == "invitee.canceled",
            "created_at": "2024-05-01T10:00:00.000000Z",
            "updated_at": "2024-05-01T10:00:00.000000Z",
        },
    }


def test_calendly_bookings_and_a_reschedule(stack: Stack) -> None:
    email = _email("ann")
    first = f"https://api.calendly.com/scheduled_events/{uuid.uuid4().hex[:16].upper()}"
    second = f"https://api.calendly.com/scheduled_events/{uuid.uuid4().hex[:16].upper()}"
    booked = _invitee("invitee.created", email, first, "INV1")
    # A reschedule: the old invitee canceled, a new one created
    canceled = _invitee("invitee.canceled", email, first, "INV1")
    rebooked = _invitee("invitee.created", email, second, "INV2")
    for payload in (booked, canceled, rebooked):
        assert send(stack, "calendly", *_calendly(payload)).status_code == 202
    # Calendly's retry of the new booking, signed anew
    assert replayed(send(stack, "calendly", *_calendly(rebooked, at=int(time.time()) + 60)))
    applied(stack, f"invitee:{email}", {"bookings": [second], "name": "Ann Example"})
    body, headers = _calendly(booked)
    refused_changes_nothing(
        stack,
        {
            "wrong key": lambda: send(stack, "calendly", *_calendly(booked, key="guess")),
            "tampered": lambda: send(stack, "calendly", body.replace(b"Ann", b"Eve"), headers),
            "stale": lambda: send(stack, "calendly", *_calendly(booked, at=int(time.time()) - 600)),
            "no signature": lambda: send(stack, "calendly", body, {}),
        },
    )

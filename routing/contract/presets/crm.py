"""CRM senders: HubSpot (v3 signatures, and v2 and v1), Salesforce's outbound messages,
Pipedrive and Intercom."""

from __future__ import annotations

from dataclasses import replace

from .model import DAY_S, Preset, SignatureLayout

_HUBSPOT_DOCS = (
    "https://developers.hubspot.com/docs/apps/developer-platform/build-apps/authentication/"
    "request-validation"
)
#: A HubSpot delivery is a JSON array of up to 100 events, each retried (up to 10 times
#: over 24 hours) with its attemptNumber raised; HubSpot says eventId alone is not
#: guaranteed unique, so the id is the portal, subscription and event together.
HUBSPOT = Preset(
    name="hubspot",
    title="HubSpot (v3 signatures)",
    check="hmac",
    # X-HubSpot-Signature-v3: base64 HMAC-SHA256 of method + URL + body + the
    # X-HubSpot-Request-Timestamp header (milliseconds).
    layout=SignatureLayout(
        header="x-hubspot-signature-v3",
        encoding="base64",
        timestamp_header="x-hubspot-request-timestamp",
        timestamp_unit="ms",
        signed_payload="{method}{url}{body}{timestamp}",
    ),
    event_id="{body:portalId}:{body:subscriptionId}:{body:eventId}",
    event_type="body:subscriptionType",
    items="body:*",
    digest_excludes=("attemptNumber",),
    retention_s=2 * DAY_S,
    docs=(
        "https://developers.hubspot.com/docs/apps/developer-platform/build-apps/"
        "authentication/request-validation"
    ),
)

CRM = (
    HUBSPOT,
    replace(
        HUBSPOT,
        name="hubspot_v2",
        title="HubSpot (v2 signatures: workflows, CRM cards)",
        # X-HubSpot-Signature: hex SHA-256 (a hash, not an HMAC) of the secret + method +
        # URL + body.
        layout=SignatureLayout(
            header="x-hubspot-signature", signed_payload="{method}{url}{body}", digest="hash"
        ),
    ),
    replace(
        HUBSPOT,
        name="hubspot_v1",
        title="HubSpot (v1 signatures)",
        layout=SignatureLayout(header="x-hubspot-signature", digest="hash"),
    ),
    Preset(
        name="salesforce",
        title="Salesforce outbound messages",
        # No signature: the organization id every message carries is checked against the
        # source's (mutual TLS and an allowlist of Salesforce's addresses sit in front).
        check="salesforce",
        needs_secrets=False,
        options=frozenset({"organization_id"}),
        body="xml",
        items="body:Envelope.Body.notifications.Notification.*",
        event_id="body:Id",  # the notification id: "check the notification IDs delivered"
        event_type="body:sObject.@type",  # sf:Contact, sf:Lead, ...
        # A retry carries the record's latest values, not the first attempt's: the same
        # notification is a duplicate whatever its sObject says now.
        digest_excludes=("sObject",),
        reply="salesforce_ack",
        retention_s=2 * DAY_S,  # retried until 24 hours old
        docs=(
            "https://developer.salesforce.com/docs/atlas.en-us.api.meta/api/"
            "sforce_api_om_outboundmessaging_understanding.htm"
        ),
    ),
    Preset(
        name="pipedrive",
        title="Pipedrive (webhooks v2, HTTP Basic)",
        check="basic",
        event_id="body:meta.id",
        event_type="{body:meta.entity}.{body:meta.action}",
        digest_excludes=("meta.attempt", "retry"),
        retention_s=3 * DAY_S,
        docs="https://pipedrive.readme.io/docs/guide-for-webhooks-v2",
    ),
    Preset(
        name="intercom",
        title="Intercom",
        check="hmac",
        layout=SignatureLayout(header="x-hub-signature", algorithm="sha1", prefix="sha1="),
        event_id="body:id",  # notif_...
        event_type="body:topic",
        digest_excludes=("delivery_attempts", "delivery_status", "delivered_at"),
        retention_s=2 * DAY_S,
        docs="https://developers.intercom.com/docs/webhooks/webhook-notifications",
    ),
)

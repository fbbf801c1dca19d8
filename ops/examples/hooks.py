"""Mapping hooks of the example sources file (ops/examples/sources.toml)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def shopify_order(payload: Any, headers: Mapping[str, str]) -> dict[str, Any] | None:
    """A Shopify ``orders/create`` webhook -> the customer's record: count the order and
    add its total in cents. Other topics map to nothing (answered ``ignored``)."""
    if headers.get("x-shopify-topic") != "orders/create":
        return None
    customer = payload["customer"]["id"]
    cents = round(float(payload["total_price"]) * 100)
    return {
        "record_key": f"shopify-customer:{customer}",
        "changes": {"orders": {"add": payload["id"]}, "spent_cents": {"increment": cents}},
    }

"""The operations listener of a receiver process: what operators and their tools read,
on an address and port of its own (``KEYLANE_OPS_HOST``, loopback by default, and
``KEYLANE_OPS_PORT``), never on the webhook port that faces the internet.

It serves ``GET /metrics`` (Prometheus text). It is a Starlette app built from a list of
routes, so that what else operators look at (the web view of deliveries, dead letters and
records, ``ops/web/``) is mounted here as more routes (``extra``), under the same address,
bounds and lifespan as the metrics, without a word of it on the webhook port.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..producers.answers import error_answer
from ..producers.receiver import BROKER_DOWN_RETRY_AFTER_S, Receiver

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def operations_app(receiver: Receiver, extra: Sequence[BaseRoute] = ()) -> Starlette:
    """The operations listener's app over ``receiver`` (whose counters and Redis reads it
    shows): ``/metrics``, then the ``extra`` routes."""

    async def metrics(request: Request) -> Response:
        try:
            await receiver.acceptor.wire.current()  # keylane_wire_version as of now
            text = await receiver.metrics.render()
        except Exception as exc:  # a scrape must say why it failed, not hang or 500 opaquely
            detail = f"cannot read metrics: {exc}"
            answer = error_answer(503, "broker_unavailable", detail, BROKER_DOWN_RETRY_AFTER_S)
            return answer.response()
        return Response(text, media_type=PROMETHEUS_TEXT)

    return Starlette(routes=[Route("/metrics", metrics, methods=["GET"]), *extra])

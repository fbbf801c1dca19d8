"""``keylane serve``: one receiver process, two listeners on one event loop.

* the **webhook port** (``KEYLANE_HOST``/``KEYLANE_PORT``, the one put on the internet):
  the receiver's app (:func:`keylane.producers.receiver_app.create_receiver`), under the
  bounds on its clients (:mod:`keylane.producers.client_bounds`);
* the **operations listener** (``KEYLANE_OPS_HOST``/``KEYLANE_OPS_PORT``, loopback by
  default): :func:`keylane.ops.operations.operations_app` over the same receiver, with
  the web view (:func:`keylane.ops.web.web_routes`, unless ``KEYLANE_WEB_VIEW`` is off),
  under the same bounds, counted apart (a flood of senders never takes its connections).

Both sockets are bound before anything starts, so a taken port ends the command at once
(exit 2, one line). The webhook server owns the signals and the lifespan: on SIGTERM it
stops accepting and drains its requests, and the operations listener stops after it
(metrics stay scrapeable while deliveries drain).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import socket
from collections.abc import Iterator

import uvicorn

from ..producers.client_bounds import ClientBounds, bounded_protocol
from ..producers.receiver_app import create_receiver
from ..routing.contract.settings import Settings
from .observability import init_sentry
from .operations import operations_app
from .up_checks import listening_socket
from .web import web_routes

log = logging.getLogger("keylane.receiver")

GRACEFUL_STOP_S = 10
#: Open files a receiver process needs beside its clients' connections: its Redis pool,
#: listeners, logs, the outcome feed.
FILES_BESIDE_CLIENTS = 256


class _Follower(uvicorn.Server):
    """A server that stops when told (``should_exit``), never on a signal of its own:
    the webhook server takes SIGTERM and SIGINT, and this one stops once it is done."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve_receiver(settings: Settings) -> None:
    """Run the receiver's two listeners until SIGTERM or SIGINT (then exit 0)."""
    # Bound before anything starts: a taken port ends the command at once (exit 2).
    public = listening_socket(
        settings.host, settings.port, "keylane serve", "--port / KEYLANE_PORT"
    )
    ops = listening_socket(
        settings.ops_host,
        settings.ops_port,
        "keylane serve's operations listener",
        "--ops-port / KEYLANE_OPS_PORT",
    )
    _room_for_connections(2 * settings.max_connections)  # the two listeners' clients
    init_sentry(settings, "receiver")  # before the app exists: the integration wraps it
    app = create_receiver(settings)
    refused = app.receiver.metrics.refused
    webhooks = _config(app, settings, ClientBounds.of(settings, lambda r: refused.labels(r).inc()))
    operations = _config(
        operations_app(app.receiver, extra=web_routes(settings)),
        settings,
        ClientBounds.of(settings, _none),
    )
    operations.lifespan = "off"  # the receiver's lifespan (the webhook server's) is the one
    # uvicorn drains on SIGTERM/SIGINT, then raises the signal again for the previous
    # handler: a handler of ours turns that graceful stop into exit code 0.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)
    log.info("receiver listening on %s", _where(public))
    shown = "/metrics and the web view, /" if settings.web_view else "/metrics"
    log.info("operations listening on %s (%s)", _where(ops), shown)
    with asyncio.Runner(loop_factory=webhooks.get_loop_factory()) as runner:
        runner.run(_serve(uvicorn.Server(webhooks), _Follower(operations), public, ops))


async def _serve(
    webhooks: uvicorn.Server, operations: uvicorn.Server, public: socket.socket, ops: socket.socket
) -> None:
    follower = asyncio.create_task(operations.serve(sockets=[ops]))
    try:
        await webhooks.serve(sockets=[public])
    finally:
        operations.should_exit = True
        await follower


def _config(app: object, settings: Settings, bounds: ClientBounds) -> uvicorn.Config:
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        log_config=None,  # keep keylane's log format for uvicorn's lines too
        log_level=settings.log_level.lower(),
        access_log=False,
        http=bounded_protocol(bounds),
        ws="none",  # no protocol may take a connection over from the bounds
        timeout_keep_alive=settings.keep_alive_s,
        timeout_graceful_shutdown=GRACEFUL_STOP_S,
    )


def _room_for_connections(clients: int) -> None:
    """Raise this process's limit of open files (up to its hard limit) to fit ``clients``
    beside what else it holds: past it, accept() fails (EMFILE) before any bound of ours
    can answer. Says so when the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = clients + FILES_BESIDE_CLIENTS
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    if raised < wanted:
        log.warning(
            "this process may open %d files (its hard limit): fewer than the %d connections "
            "KEYLANE_MAX_CONNECTIONS allows on each listener need; raise `ulimit -n`",
            raised,
            clients // 2,
        )


def _where(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{host}:{port}"


def _none(reason: str) -> None:
    """The operations listener's refusals are not deliveries refused: not counted."""

"""One worker process's lane machinery: Redis, ownership, lanes. Celery-independent, so
the Celery bootstep (:mod:`keylane.workers.worker`) only starts and stops it."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from ..routing.contract.errors import ConfigError
from ..routing.contract.faults import Faults
from ..routing.contract.settings import Settings
from ..routing.contract.sources import Sources, load_sources
from ..routing.contract.wire import LAYOUT_VERSION, WIRE_VERSION
from . import dead_letters
from .brokers.choice import open_lane_broker
from .brokers.rabbitmq import RabbitLaneBroker
from .brokers.redis import RedisLaneBroker
from .destinations import Destination, open_destinations
from .dispatch import Dispatcher
from .faults import crash
from .flow import DestinationFlow
from .jobs import RECHECK_HANDLER, scheduled_jobs
from .lane_record import LaneEvents
from .lanes import Lanes
from .ownership import Ownership
from .stores import open_store
from .stores.sql import SqlStore
from .tasks import import_app
from .writer import StoreWriter

log = logging.getLogger("keylane.worker")


def worker_store_url(settings: Settings) -> str:
    """The store URL for a worker's connections. On PostgreSQL the server ends a
    transaction left idle for half a lease TTL (at most the store timeout): a worker paused
    in the middle of a write (GC, VM freeze, debugger) would otherwise keep its row locks,
    the shard's fence row among them, and the next owner could not register its fencing
    token until the paused one woke up. Ended by the server, the paused write is rolled
    back; its event is still in flight, and the next owner applies it."""
    url = settings.store_dsn()
    if settings.store_is_sqlite:
        return url
    timeout_ms = min(settings.store_timeout_ms, settings.lease_ttl_ms // 2)
    option = f"-c idle_in_transaction_session_timeout={timeout_ms}"
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(name == "options" for name, _ in query):
        query = [(n, f"{v} {option}" if n == "options" else v) for n, v in query]
    else:
        query.append(("options", option))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def new_worker_id() -> str:
    """A worker id unique across hosts and restarts: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class LaneService:
    """Everything a worker process runs besides Celery's own consumer."""

    def __init__(
        self,
        settings: Settings,
        worker_id: str | None = None,
        sources: Sources | None = None,
        events: LaneEvents | None = None,
    ) -> None:
        self.settings = settings
        self.worker_id = worker_id or new_worker_id()
        configured = sources or load_sources(settings)
        self.destinations = prepare_destinations(settings, configured)
        # After the app's import: its scheduled jobs and repairs are registered by then.
        self.sources = configured.with_jobs(scheduled_jobs(configured), RECHECK_HANDLER)
        self.broker, flow = self._open_broker()
        info: dict[str, object] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "lanes": settings.lanes,
            "started": time.time(),
            # The newest wire version this worker reads: producers write no newer one
            # while it is a member (routing/contract/wire.py)
            "wire": WIRE_VERSION,
        }
        faults = Faults(settings.faults, crash)
        self.writer = (
            StoreWriter(self.redis, settings, self.worker_id)
            if settings.store_is_sqlite and self.redis is not None
            else None
        )
        # The broker and the store connections are this service's; each part gets the
        # roles it uses: the ownership the leases and the fences, the lanes the record
        # queue and the message notes, the dispatcher the notes.
        self.ownership = Ownership(
            settings, self.broker, self.open_store, self.worker_id, info, writer=self.writer
        )
        self.lanes = Lanes(
            settings,
            self.broker,
            self.broker,
            self.ownership,
            self.sources,
            self.open_store,
            faults,
            Dispatcher(settings, self.broker, flow, self.destinations, faults, self.sources),
            events,
        )

    def _open_broker(self) -> tuple[RedisLaneBroker | RabbitLaneBroker, DestinationFlow]:
        """The lane broker ``KEYLANE_BROKER_URL`` names (Redis unless it is amqp://), and
        destinations' flow control (always on Redis: on RabbitMQ an optional helper)."""
        s = self.settings
        check_broker_config(s, self.destinations)
        broker, self.redis = open_lane_broker(s, self.open_store, self._past_delivery_limit)
        flow = self.redis.flow if self.redis is not None else DestinationFlow(s.keys, _no_flow)
        return broker, flow

    def _past_delivery_limit(self, raw: bytes, headers: dict[str, object]) -> None:
        store = self.open_store()
        try:
            deliveries = self.settings.max_deliveries + self.settings.amqp_delivery_margin + 1
            result = dead_letters.past_delivery_limit(store, raw, deliveries)
            log.error("a message past the broker's delivery limit became a dead letter: %s", result)
        finally:
            store.close()

    def open_store(self) -> SqlStore:
        """A new store connection (one per thread), every role: its opener owns it."""
        s = self.settings
        return open_store(worker_store_url(s), s.store_timeout_ms, s.sqlite_synchronous)

    def start(self) -> None:
        """Claim the SQLite store (one writer process), create the schema, join the
        members, take shards and start the lanes."""
        if self.redis is not None:
            self.redis.check_server()  # refuses a Redis older than the scripts need
            self.redis.claim_layout(LAYOUT_VERSION)  # refuses a newer release's namespace
        if self.writer is not None:
            self.writer.claim()
        store = self.open_store()
        try:
            store.migrate()
        finally:
            store.close()
        self.ownership.start()
        self.lanes.start()
        log.info(
            "worker %s started with %s lanes, owns %s shards%s",
            self.worker_id,
            self.settings.lanes,
            len(self.ownership.owned()),
            "; the SQLite store's one writer" if self.writer is not None else "",
        )

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish in-flight messages, acknowledge them, release every lease, leave."""
        self.ownership.stop(timeout_s)
        self.lanes.stop(timeout_s)  # closes the destinations as its loop ends
        self.broker.close()  # after the acks and handoffs queued so far
        log.info("worker %s stopped", self.worker_id)


def check_broker_config(settings: Settings, destinations: dict[str, Destination]) -> None:
    """What the RabbitMQ broker does not do (yet): a SQLite store (its one-writer claim
    lives in Redis; RabbitMQ is for deployments of several machines: PostgreSQL),
    destinations without a Redis for their flow control."""
    if not settings.broker_is_rabbitmq:
        return
    if settings.store_is_sqlite:
        raise ConfigError("KEYLANE_BROKER_URL=amqp://... needs a PostgreSQL store")
    if destinations and settings.redis_url is None:
        raise ConfigError(
            "destinations on RabbitMQ keep their flow control in Redis: set KEYLANE_REDIS_URL"
        )


def _no_flow(name: str, keys: list[str], args: list[object]) -> object:
    raise ConfigError("destination flow control needs KEYLANE_REDIS_URL")


def prepare_destinations(settings: Settings, sources: Sources) -> dict[str, Destination]:
    """Import the user's app modules, then open every destination, checking what can be
    checked before any event arrives (``ConfigError`` says what is wrong)."""
    import_app(settings.app_modules)
    destinations = open_destinations(sources, settings.max_attempts)
    for destination in destinations.values():
        settings.check_destination_timeout(destination.config.name, destination.config.timeout_s)
    return destinations


def check_worker_config(settings: Settings) -> list[str]:
    """What a worker checks before it starts (the app imports, every destination can be
    opened, the scheduled jobs load and their sources fit); the destination names.
    Raises ``ConfigError``."""
    sources = load_sources(settings)
    destinations = prepare_destinations(settings, sources)
    sources.with_jobs(scheduled_jobs(sources), RECHECK_HANDLER)
    for destination in destinations.values():
        destination.close()
    return sorted(destinations)

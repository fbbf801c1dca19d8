"""keylane's settings: one object, built once at start-up from ``KEYLANE_*`` variables.

Nothing reads the environment at import time; processes call
:func:`keylane.routing.contract.settings_env.load_settings` in their entry point and pass the
object down (that module also names a setting's variable and turns a pydantic error into
what is wrong, by variable).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from pydantic import (
    AliasChoices,
    BaseModel,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from .. import DEFAULT_SHARD_COUNT, ShardMap
from ..redis_keys import RedisKeys
from ..shards import MAX_SHARD_COUNT
from .errors import ConfigError

#: The most events of one record taken together (a source's batch, a task's batch).
MAX_BATCH = 256
#: Records a worker process keeps in flight by default: lanes are coroutines, so a lane
#: waiting for a slow destination costs no thread; 256 keep an async task of 200 ms at
#: about 1,000 events/s per process before CPU is the limit.
DEFAULT_LANES = 256
#: How often a process's kept counts are written to the deployment's counters (ms).
DEFAULT_COUNTS_FLUSH_MS = 1_000

DAY_S = 24 * 3600
THREE_DAYS_S = 3 * DAY_S
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class FaultSpec(BaseModel):
    """A fault to inject at a named point (testing only; off unless configured)."""

    point: str
    action: Literal["kill", "sleep", "raise", "bump"]
    match: str | None = None  # only when the record key starts with this
    sleep_ms: int = 0
    times: int | None = None  # fire at most this many times per process


class Settings(BaseSettings):
    """Every knob of a keylane deployment. Environment: ``KEYLANE_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="KEYLANE_", extra="ignore")

    data_dir: Path = Path("keylane-data")
    redis_url: SecretStr | None = None
    store_url: SecretStr | None = None
    # The broker of the shard queues: unset (the default) is Redis (KEYLANE_REDIS_URL, or
    # the one `keylane up` embeds); ``amqp://user:pass@host1:5672,host2:5672/vhost`` is a
    # RabbitMQ cluster (docs: ops/docs/rabbitmq.md).
    broker_url: SecretStr | None = None
    namespace: str = "keylane"

    # Lanes
    shard_count: int = Field(DEFAULT_SHARD_COUNT, ge=1, le=MAX_SHARD_COUNT)
    max_attempts: int = Field(3, ge=1, le=100)
    max_deliveries: int = Field(5, ge=1, le=1000)
    # The most a task's result (what it returned, as JSON) may take in its journal entry;
    # past it the event is still applied, its result replaced by a note (docs: conditions.md)
    result_max_bytes: int = Field(65_536, ge=256, le=16 * 1_048_576)
    # Records in flight at once per worker process (coroutines: an async task or an HTTP
    # forward waits without a thread) and the threads for blocking calls (store
    # transactions, Redis scripts, plain ``def`` handlers and tasks).
    lanes: int = Field(DEFAULT_LANES, ge=1, le=1024)
    lane_threads: int = Field(8, ge=1, le=256)
    # Events of one record a lane applies in one transaction when several are waiting
    # (sources that change keylane's own records; a source's ``batch`` overrides it).
    batch_max: int = Field(32, ge=1, le=MAX_BATCH)
    worker_processes: int | None = Field(None, ge=1, le=64)  # what `keylane up` starts
    lease_ttl_ms: int = Field(10_000, ge=200)
    heartbeat_ms: int = Field(2_000, ge=50)
    handler_time_limit_ms: int = Field(10_000, ge=10)
    store_timeout_ms: int = Field(5_000, ge=10)
    inflight_deadline_ms: int = Field(120_000, ge=100)
    # How often an idle lane looks at every shard for what nothing rang for (a task sent
    # with Celery's own send_task; rings are not missed otherwise: docs, failure-model.md)
    idle_poll_ms: int = Field(2_000, ge=1)
    # How often a receiver and a worker add the counts they kept in the process (accepted,
    # outcomes, latency, drain counts) to the deployment's counters: status and /metrics
    # see them this late, and a process killed with -9 loses at most this long's counts
    # (never an event: keylane.routing.contract.tallies).
    counts_flush_ms: int = Field(DEFAULT_COUNTS_FLUSH_MS, ge=10, le=60_000)
    # RabbitMQ only: deliveries of one shard a worker holds at once (its records in
    # flight and waiting behind them), the AMQP heartbeat (a paused worker loses its
    # shards after about two missed ones), how long a publish waits for its confirm, and
    # how far past KEYLANE_MAX_DELIVERIES the broker's own delivery limit sits (the
    # backstop that turns a message keylane never finished into a `poison` dead letter).
    # A record that would keep its deliveries longer than half `amqp_hold_budget_s` is
    # parked in the store (keep it well under the broker's consumer_timeout, 30 min).
    amqp_prefetch: int = Field(256, ge=1, le=65535)
    amqp_heartbeat_s: int = Field(10, ge=1, le=600)
    amqp_confirm_timeout_ms: int = Field(5_000, ge=10)
    amqp_delivery_margin: int = Field(3, ge=1, le=100)
    amqp_hold_budget_s: int = Field(600, ge=1)
    # User tasks: modules imported before the lanes start (comma-separated), as `celery -A`
    app: str | None = None

    # Receiver
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    #: How long the receiver keeps an idle connection open for the next request: longer
    #: than the idle timeout of what sits in front of it (a load balancer's 60 s, a
    #: client's pool), or a request sent as the server closes the connection is reset.
    keep_alive_s: int = Field(75, ge=1, le=3600)
    max_body_bytes: int = Field(1_048_576, ge=1024)
    #: Deliveries turned away kept per source (a Redis stream, ops/docs/deliveries.md); 0: off.
    door_keep: int = Field(1000, ge=0, le=1_000_000)
    #: Which deliveries a source keeps when its table does not say (``keep_deliveries``).
    keep_deliveries: Literal["off", "errors", "all"] = "errors"
    # The most events one batched delivery may hold (HubSpot sends up to 100, Salesforce
    # up to 100, Meta up to 1,000); past it the delivery is a 413 and nothing is queued.
    max_batch_items: int = Field(1000, ge=1, le=100_000)
    # The URL senders call the receiver at, as they see it (https://hooks.example.com):
    # what Twilio and HubSpot sign, with the request's path and query after it. Never read
    # from the Host header, which a sender (or anyone) chooses. A source's `public_url`
    # (the whole URL of its webhook) overrides it.
    public_url: str | None = None
    # Bounds on each client of the receiver (ops/docs/production.md). A request's line
    # and headers must arrive within this time of its first byte (of the connection, for
    # its first request), else 408 and the connection is closed
    header_timeout_s: int = Field(10, ge=1, le=3600)
    # The most a request's line and headers may take, else 431 and the connection closed
    header_max_bytes: int = Field(65_536, ge=1024, le=16 * 1_048_576)
    # The longest a request's body may take to arrive after its headers, else 408, closed
    body_timeout_s: int = Field(30, ge=1, le=3600)
    # Open connections one receiver serves; past it a new connection is answered 503 with
    # `Connection: close` and `Retry-After`, while those already open are served as before
    max_connections: int = Field(1000, ge=1, le=1_000_000)
    dedupe_retention_s: int = Field(THREE_DAYS_S, ge=1)
    shard_high_water: int = Field(10_000, ge=1)
    global_high_water: int = Field(200_000, ge=1)
    sources_file: Path | None = None
    # Outcomes (ops/docs/outcomes.md): the longest a request may wait for its event's
    # outcome (`Prefer: wait=N` is capped by it), and the bearer token that opens
    # `GET /outcomes/...` for every source (none: closed, unless a source sets its own)
    outcome_wait_max_s: int = Field(30, ge=0, le=600)
    # How long Redis keeps an event's told outcome after its lane decided it: for the
    # senders that wait, ask or retry soon. A replay after that (within the dedupe window)
    # is queued again and told anew by its lane, from the journal, waited for up to
    # `outcome_replay_wait_s` (ops/docs/outcomes.md, "How long, and what it costs")
    outcome_keep_s: int = Field(3600, ge=1)
    outcome_replay_wait_s: int = Field(5, ge=0, le=60)
    outcomes_token: SecretStr | None = None

    # Operations

    # The operations listener of each receiver process: /metrics (and what operators
    # look at), never on the webhook port; loopback unless set
    ops_host: str = "127.0.0.1"
    ops_port: int = Field(8100, ge=0, le=65535)  # 0: a port the system picks
    # The web view of deliveries, dead letters and records on it (docs: web-view.md)
    web_view: bool = True
    sentry_dsn: SecretStr | None = Field(
        None, validation_alias=AliasChoices("KEYLANE_SENTRY_DSN", "SENTRY_DSN")
    )
    flower_port: int = Field(5555, ge=0, le=65535)
    flower_address: str = "127.0.0.1"
    flower_basic_auth: SecretStr | None = None
    sqlite_synchronous: Literal["NORMAL", "FULL"] = "FULL"

    # Retention: what the store keeps in its tables, and for how long (see the docs,
    # ops/docs/retention.md). A journal row stays at least its source's dedupe
    # retention plus ``journal_margin_s``; ``journal_retention_s`` (or a source's own)
    # may only lengthen that. Archived event ids are still recognised for
    # ``archived_id_retention_s`` after their event (0: not at all).
    journal_retention_s: int | None = Field(None, ge=1)
    journal_margin_s: int = Field(DAY_S, ge=0)
    archived_id_retention_s: int = Field(30 * DAY_S, ge=0)
    dead_letter_retention_s: int = Field(30 * DAY_S, ge=1)  # after the row was closed
    lease_log_retention_s: int = Field(7 * DAY_S, ge=1)
    archive_dir: Path | None = None  # default: <data dir>/archive
    prune_batch_rows: int = Field(500, ge=1, le=10_000)  # rows per delete transaction
    prune_pause_ms: int = Field(20, ge=0)  # between two delete transactions, at least
    # How often `keylane up`'s scheduler runs the prune (a scheduled job of keylane's own,
    # keylane.journal-prune: one runner at a time, a standby taking over); 0: never.
    prune_every_s: int = Field(600, ge=0)
    log_level: str = "INFO"  # DEBUG, INFO, WARNING, ERROR or CRITICAL (any case)
    log_format: Literal["text", "json"] = "text"
    task_events: bool = True  # Celery task events for Flower's task list
    faults: list[FaultSpec] = Field(default_factory=list)

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, level: str) -> str:
        if level.upper() not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return level.upper()

    @model_validator(mode="after")
    def _check_timing(self) -> Settings:
        if self.heartbeat_ms * 3 > self.lease_ttl_ms:
            raise ValueError(
                f"KEYLANE_HEARTBEAT_MS ({self.heartbeat_ms}) must be at most a third of "
                f"KEYLANE_LEASE_TTL_MS ({self.lease_ttl_ms}), so two renewals can fail before "
                "the lease expires"
            )
        if self.worst_case_ms * 2 > self.inflight_deadline_ms:
            raise ValueError(
                f"a message's worst case, KEYLANE_MAX_ATTEMPTS x (KEYLANE_HANDLER_TIME_LIMIT_MS "
                f"+ 2 x KEYLANE_STORE_TIMEOUT_MS) = {self.worst_case_ms} ms, must stay under "
                f"half of KEYLANE_INFLIGHT_DEADLINE_MS ({self.inflight_deadline_ms}), after "
                "which a lane counts as stuck"
            )
        return self

    @property
    def worst_case_ms(self) -> int:
        """The longest one message may legitimately keep a lane busy."""
        return self.max_attempts * (self.handler_time_limit_ms + 2 * self.store_timeout_ms)

    @property
    def app_modules(self) -> list[str]:
        """The modules of ``app`` (``KEYLANE_APP`` or ``-A``), in order."""
        return [m.strip() for m in (self.app or "").split(",") if m.strip()]

    def check_destination_timeout(self, name: str, timeout_s: float) -> None:
        """A destination's calls must end well inside the in-flight deadline: its
        ``max_attempts`` calls (conflicts are re-run) at most half of it."""
        worst_ms = self.max_attempts * timeout_s * 1000
        if worst_ms * 2 > self.inflight_deadline_ms:
            raise ConfigError(
                f"destination {name}: KEYLANE_MAX_ATTEMPTS x timeout_s = {worst_ms:.0f} ms must "
                f"stay under half of KEYLANE_INFLIGHT_DEADLINE_MS ({self.inflight_deadline_ms})"
            )

    @property
    def store_is_sqlite(self) -> bool:
        """Whether the store is SQLite, which takes one writer process."""
        return urlparse(self.store_dsn()).scheme == "sqlite"

    def worker_process_count(self) -> int:
        """How many worker processes ``keylane up`` starts: ``worker_processes``, else 1 on
        SQLite and 2 on PostgreSQL. SQLite has one write lock for the whole file, and a
        worker paused while it holds it (GC, VM freeze, debugger, full disk) would stall
        every other worker's shards: several worker processes need PostgreSQL."""
        if not self.store_is_sqlite:
            return self.worker_processes or 2
        if (self.worker_processes or 1) > 1:
            raise ConfigError(
                f"{self.worker_processes} worker processes on a SQLite store: SQLite takes one "
                "writer process. Run more lanes in that one process (--lanes N, "
                "KEYLANE_LANES), or use PostgreSQL for several worker processes "
                "(--store-url postgresql://..., KEYLANE_STORE_URL)"
            )
        return 1

    @property
    def shards(self) -> ShardMap:
        """The deployment's shard map."""
        return ShardMap(self.shard_count)

    @property
    def keys(self) -> RedisKeys:
        """Redis key names under this deployment's namespace."""
        return RedisKeys(self.namespace)

    @property
    def archive_path(self) -> Path:
        """Where rows leaving the store's tables are archived."""
        return self.archive_dir if self.archive_dir is not None else self.data_dir / "archive"

    @property
    def sqlite_path(self) -> Path:
        """Where the default SQLite store lives."""
        return self.data_dir / "keylane.sqlite3"

    def store_dsn(self) -> str:
        """The store URL: ``KEYLANE_STORE_URL`` or the SQLite file in the data directory."""
        if self.store_url is not None:
            return self.store_url.get_secret_value()
        return f"sqlite:///{self.sqlite_path.resolve()}"

    @property
    def broker_is_rabbitmq(self) -> bool:
        """Whether the shard queues live on RabbitMQ (``KEYLANE_BROKER_URL=amqp://...``)."""
        return self.broker_url is not None and self.broker_url.get_secret_value().startswith(
            ("amqp://", "amqps://")
        )

    def amqp_urls(self) -> list[str]:
        """One URL per RabbitMQ node of ``KEYLANE_BROKER_URL``: the hosts of
        ``amqp://user:pass@a:5672,b:5672/vhost`` each with the credentials and vhost, or
        the URLs of kombu's failover form ``amqp://a;amqp://b``."""
        if not self.broker_is_rabbitmq:
            raise ConfigError("KEYLANE_BROKER_URL is not an amqp:// URL")
        assert self.broker_url is not None
        return amqp_node_urls(self.broker_url.get_secret_value())

    def redis_dsn(self) -> str:
        """The Redis URL (``KEYLANE_REDIS_URL``; the ``keylane`` command and ``import
        keylane`` fill it in with the data directory's embedded Redis when it is unset:
        :func:`keylane.ops.embedded_redis.with_embedded_redis`)."""
        if self.redis_url is not None:
            return self.redis_url.get_secret_value()
        raise ConfigError(
            "no Redis: KEYLANE_REDIS_URL (--redis-url) is not set, and no `keylane up` runs an "
            f"embedded Redis for the data directory {self.data_dir.resolve()} (--data-dir / "
            "KEYLANE_DATA_DIR; default: keylane-data in the current folder). Run the command "
            "from the folder `keylane up` runs in, give its --data-dir, or set KEYLANE_REDIS_URL"
        )


def amqp_node_urls(url: str) -> list[str]:
    """Split a several-node AMQP URL into one URL per node (see :meth:`Settings.amqp_urls`)."""
    if ";" in url:
        return [part.strip() for part in url.split(";") if part.strip()]
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    auth, at, hosts = netloc.rpartition("@")
    prefix = f"{scheme}://{auth}{at}"
    return [f"{prefix}{host.strip()}{slash}{path}" for host in hosts.split(",") if host.strip()]

"""Destinations: where an event goes when keylane does not write it to its own records.

A sources file declares them next to the sources, one ``[destinations.<name>]`` table
each, and a source names one (``destination = "crm"``) or names a user task
(``task = "sync_contact"``, a destination of kind ``task`` without limits)::

    [destinations.crm]
    kind = "http"                           # POST each event to url
    url = "https://hooks.example.com/abc"
    headers = { Authorization = "env:CRM_TOKEN" }   # "env:NAME" reads the environment
    secret_env = "CRM_SIGNING_SECRET"       # sign with Standard Webhooks (optional)
    timeout_s = 10
    max_in_flight = 4                       # calls at once, over every worker
    rate_per_s = 3                          # calls per second, over every worker
    retry_for_s = 3600                      # keep retrying a failing event this long

    [destinations.notion]
    kind = "task"                           # run a registered Python task ...
    task = "sync_contact"                   # ... under this destination's limits

    [destinations.contacts]
    kind = "etag"                           # or "pg_table", "stamped": a place that holds
    url = "https://crm.example.com/contacts/{key.1}"  # the records, written version-checked
    rate_per_s = 3                          # (see keylane.routing.contract.resources)

A source names a forwarding destination (``http``, ``task``) with ``destination = "..."``:
its events carry the delivery's body as their payload. It names a version-checked one with
``records_in = "..."``: its events are changes, as for keylane's own records, applied to
the record where it lives.

Flow control is shared by every worker through Redis (the flow script in
``workers/brokers/redis/flow_*.lua``); :class:`FlowState` is what it keeps, as read by
``producers/state_reads.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .errors import ConfigError
from .names import TABLE_NAME
from .resources import (
    RESOURCE_KINDS,
    PgTableResourceConfig,
    ResourceConfig,
    ResourceKind,
    check_env_name,
    check_headers,
    env_names_of,
    parse_resource,
)

#: Prefix of the destinations keylane makes for a source's ``task = "..."``.
TASK_PREFIX = "task:"
#: Headers keylane sets on every forward: a destination's own headers may not replace them.
RESERVED_HEADERS = frozenset(
    {"content-type", "idempotency-key", "webhook-id", "webhook-timestamp", "webhook-signature"}
)
#: How much of a destination's answer, or of an error, is kept (journal, dead letters).
EXCERPT_CHARS = 2000


def check_task_name(name: str) -> str:
    """A task name: what sources and destinations refer to (``ValueError`` if invalid)."""
    if not TABLE_NAME.fullmatch(name):
        raise ValueError(f"task names are lowercase [a-z0-9_.-], 1..64 chars: {name!r}")
    return name


class _FlowKeys(BaseModel):
    """The keys every kind of destination takes: its name, its kind and its flow control.
    A version-checked kind's other keys describe where its records live (its resource)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: Literal["http", "task"] | ResourceKind
    max_in_flight: int | None = Field(None, ge=1, le=10_000)
    rate_per_s: float | None = Field(None, gt=0, le=100_000)
    adaptive: bool = True  # after a 429, lower the rate, then raise it while calls succeed
    retry_for_s: float = Field(3600.0, ge=0)
    max_backoff_s: float = Field(60.0, gt=0, le=3600)


FLOW_KEYS = tuple(_FlowKeys.model_fields)


class DestinationConfig(_FlowKeys):
    """One destination, as declared (or, for a source's ``task``, implied)."""

    resource: ResourceConfig | None = None  # a version-checked kind's records
    url: str | None = None
    task: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    secret_env: str | None = None
    timeout_s: float = Field(10.0, gt=0, le=300)

    @model_validator(mode="before")
    @classmethod
    def _split_resource(cls, raw: Any) -> Any:
        """A version-checked kind's table: flow control here, the rest is its resource."""
        if not isinstance(raw, dict) or raw.get("kind") not in RESOURCE_KINDS:
            return raw
        if "resource" in raw:
            return raw
        own = {k: v for k, v in raw.items() if k in FLOW_KEYS}
        resource = parse_resource(
            str(raw.get("name", "?")),
            {k: v for k, v in raw.items() if k not in FLOW_KEYS or k == "kind"},
        )
        timeout_s = getattr(resource, "timeout_s", None)
        return {**own, "resource": resource, **({"timeout_s": timeout_s} if timeout_s else {})}

    @field_validator("name")
    @classmethod
    def _check_name(cls, name: str) -> str:
        if name.startswith(TASK_PREFIX):
            check_task_name(name.removeprefix(TASK_PREFIX))
            return name
        if not TABLE_NAME.fullmatch(name):
            raise ValueError(f"destination names are lowercase [a-z0-9_.-], 1..64 chars: {name!r}")
        return name

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        if url is None:
            return url
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http:// or https:// with a host, got {url!r}")
        return url

    @field_validator("task")
    @classmethod
    def _check_task(cls, task: str | None) -> str | None:
        return task if task is None else check_task_name(task)

    @field_validator("secret_env")
    @classmethod
    def _check_env(cls, name: str | None) -> str | None:
        return check_env_name(name, "secret_env")

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        return check_headers(headers, RESERVED_HEADERS)

    @model_validator(mode="after")
    def _check_kind(self) -> DestinationConfig:
        if self.kind == "http" and (self.url is None or self.task is not None):
            raise ValueError('kind = "http" needs url (and no task)')
        if self.kind == "task" and (self.task is None or self.url is not None):
            raise ValueError('kind = "task" needs task (and no url)')
        if self.kind == "task" and (self.headers or self.secret_env):
            raise ValueError("headers and secret_env apply to http destinations only")
        if (self.kind in RESOURCE_KINDS) != (self.resource is not None):
            raise ValueError(f"kind = {self.kind!r} and its resource do not match")
        return self

    @property
    def versioned(self) -> bool:
        """Whether it holds records, written version-checked (a source's ``records_in``)."""
        return self.resource is not None

    def env_names(self) -> list[str]:
        """Every environment variable this destination reads (secrets, headers, URLs)."""
        names = [self.secret_env] if self.secret_env else []
        headers = dict(self.headers)
        if self.resource is not None:
            headers.update(getattr(self.resource, "headers", {}))
        if isinstance(self.resource, PgTableResourceConfig):
            names.append(self.resource.url_env)
        return names + env_names_of(headers)

    def check_environment(self, environ: dict[str, str]) -> None:
        """Refuse to start when a variable it reads is missing (named, never its value)."""
        missing = [n for n in self.env_names() if not environ.get(n)]
        if missing:
            raise ConfigError(
                f"destination {self.name}: environment variable(s) {', '.join(missing)} not set"
            )


def task_destination(task: str) -> DestinationConfig:
    """The destination of a source that names ``task = "..."``: the task, no limits."""
    return DestinationConfig(name=f"{TASK_PREFIX}{task}", kind="task", task=task)


def retry_delay_s(retries: int, max_backoff_s: float, jitter: float) -> float:
    """Exponential back-off with jitter: about 0.5 s, 1 s, 2 s, ... up to ``max_backoff_s``;
    ``jitter`` in [0, 1) spreads the second half of each delay."""
    delay: float = min(max_backoff_s, 0.5 * 2.0 ** max(0, retries - 1))
    return delay / 2 + delay / 2 * jitter


#: What a destination's calls ended with, as counted by the flow script (the other
#: counters: ``calls`` started, ``waits`` refused for a while, ``rate_cuts`` after 429s).
CALL_OUTCOMES = ("done", "retried", "gave_up", "conflicts", "failed")


@dataclass(frozen=True)
class FlowState:
    """One destination's flow control as the flow script keeps it, at ``now_ms``."""

    name: str
    in_flight: int
    max_in_flight: int | None
    rate_per_s: float | None  # as configured
    tokens: float
    paused_for_s: float
    counters: dict[str, int]
    adapted_rate_per_s: float | None = None  # lowered after a 429, while it is lower

    @property
    def rate_now(self) -> float | None:
        """Calls per second allowed now: the adapted rate when lower than the configured
        one (None: no limit)."""
        adapted, configured = self.adapted_rate_per_s, self.rate_per_s
        if adapted is not None and (configured is None or adapted < configured):
            return adapted
        return configured

    @property
    def next_token_s(self) -> float:
        """Seconds until a call may start as far as the rate allows (0: now)."""
        wait = self.paused_for_s
        rate = self.rate_now
        if rate and self.tokens < 1:
            wait = max(wait, (1 - self.tokens) / rate)
        return round(wait, 3)

    @classmethod
    def of(
        cls,
        name: str,
        bucket: dict[str, str],
        in_flight: int,
        counters: dict[str, int],
        now_ms: int,
    ) -> FlowState:
        """Read the bucket hash (``max``, ``rate``, ``adapted``, ``tokens``, ``ts``,
        ``paused``)."""
        rate = float(bucket.get("rate") or 0)
        adapted = float(bucket.get("adapted") or 0)
        max_in_flight = int(float(bucket.get("max") or 0))
        tokens = float(bucket.get("tokens") or 1)
        filling = adapted if adapted and (not rate or adapted < rate) else rate
        if filling > 0:
            elapsed_s = max(0, now_ms - int(float(bucket.get("ts") or now_ms))) / 1000
            tokens = min(1.0, tokens + elapsed_s * filling)
        paused_ms = max(0, int(float(bucket.get("paused") or 0)) - now_ms)
        return cls(
            name=name,
            in_flight=in_flight,
            max_in_flight=max_in_flight or None,
            rate_per_s=rate or None,
            tokens=round(tokens, 3) if not math.isnan(tokens) else 0.0,
            paused_for_s=paused_ms / 1000,
            counters=counters,
            adapted_rate_per_s=round(adapted, 3) if adapted else None,
        )

"""Version-checked destinations: where a record lives outside keylane, and how to reach it.

A destination of one of these kinds holds the record itself, and keylane writes to it with
the same discipline as to its own store (fresh read, change, write only if still the
version read). Declared next to the sources, one ``[destinations.<name>]`` table each::

    [destinations.crm]
    kind = "etag"                               # GET, then PATCH/PUT with If-Match
    url = "https://crm.example.com/contacts/{key.1}"
    write = "patch"                             # or "put": the whole body, merged on the read
    fields_at = "properties"                    # where the fields sit in the body
    headers = { Authorization = "env:CRM_AUTHORIZATION" }

    [destinations.warehouse]
    kind = "pg_table"                           # the user's own PostgreSQL table
    url_env = "WAREHOUSE_URL"
    table = "public.contacts"
    key_column = "id"
    key = "{key.1}"
    version_column = "revision"                 # integer revision ...
    version_kind = "integer"                    # ... or "timestamp" (an updated_at column)
    columns = { email = "email", visits = "visit_count" }

    [destinations.airtable]
    kind = "stamped"                            # no versions: compare right before writing
    url = "https://api.airtable.com/v0/app1/Contacts/{key.1}"
    fields_at = "fields"
    stamp_at = "last_modified"                  # or leave out: compare the fields' values
    headers = { Authorization = "env:AIRTABLE_AUTHORIZATION" }

Templates take ``{key}`` (the whole record key) and ``{key.N}`` (its N-th part, split at
``:``, from 0), each percent-encoded. A header value ``"env:NAME"`` is read from the
environment variable ``NAME`` at start-up. Everything here is pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Annotated, Literal, get_args
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import ConfigError
from .events import check_field_name
from .names import ENV_NAME, HEADER_NAME

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_KEY_PART = re.compile(r"^key(?:\.(\d{1,2}))?$")
_PATH = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
ENV_PREFIX = "env:"


def check_key_template(template: str) -> str:
    """``template`` if its placeholders are ``{key}`` or ``{key.N}`` (``ValueError`` if not)."""
    for name in _PLACEHOLDER.findall(template):
        if not _KEY_PART.match(name):
            raise ValueError(f"unknown placeholder {{{name}}}: use {{key}} or {{key.N}}")
    if "{" in _PLACEHOLDER.sub("", template) or "}" in _PLACEHOLDER.sub("", template):
        raise ValueError(f"unbalanced braces in {template!r}")
    return template


def render_key_template(template: str, key: str, url: bool = True) -> str:
    """``template`` with the record key put in (percent-encoded when ``url``);
    ``ValueError`` when the key has fewer ``:``-separated parts than the template names."""
    parts = key.split(":")
    encode = (lambda text: quote(text, safe="")) if url else (lambda text: text)

    def one(match: re.Match[str]) -> str:
        index = _KEY_PART.match(match.group(1))
        assert index is not None  # checked when the configuration was read
        if index.group(1) is None:
            return encode(key)
        n = int(index.group(1))
        if n >= len(parts) or not parts[n]:
            raise ValueError(f"record key {key!r} has no part {n} (parts are split at ':')")
        return encode(parts[n])

    return _PLACEHOLDER.sub(one, template)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HttpResourceConfig(_Strict):
    """What the HTTP kinds share: where a record is, and the headers of every call."""

    url: str
    fields_at: str | None = None  # dotted path of the fields object; None: the body itself
    headers: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = Field(10.0, gt=0, le=300)

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        check_key_template(url)
        parts = urlsplit(_PLACEHOLDER.sub("x", url))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http:// or https:// with a host, got {url!r}")
        if "{key" not in url:
            raise ValueError(f"url must name the record: {{key}} or {{key.N}} in {url!r}")
        return url

    @field_validator("fields_at")
    @classmethod
    def _check_fields_at(cls, path: str | None) -> str | None:
        return _check_path(path)

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        return check_headers(headers, ("if-match", "if-none-match", "content-type"))

    def url_for(self, key: str) -> str:
        """The URL of the record ``key`` (``ValueError`` if the key does not fit)."""
        return render_key_template(self.url, key)

    def resolved_headers(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The headers with ``env:NAME`` values read from ``environ``; ``ConfigError``
        names a missing variable (never a value)."""
        env_names = {n: v[len(ENV_PREFIX) :] for n, v in self.headers.items() if _is_env(v)}
        missing = sorted(name for name in env_names.values() if not environ.get(name))
        if missing:
            raise ConfigError(f"environment variable(s) {', '.join(missing)} not set")
        return {n: environ[env_names[n]] if n in env_names else v for n, v in self.headers.items()}


def check_headers(headers: dict[str, str], reserved: Collection[str]) -> dict[str, str]:
    """``headers`` of a destination table, if every name is a header name that keylane does
    not set itself (``reserved``, lowercase) and every ``env:`` value names a variable."""
    for name, value in headers.items():
        if not HEADER_NAME.fullmatch(name):
            raise ValueError(f"not a header name: {name!r}")
        if name.lower() in reserved:
            raise ValueError(f"header {name} is set by keylane on every call")
        if _is_env(value) and not ENV_NAME.fullmatch(value[len(ENV_PREFIX) :]):
            raise ValueError(f"header {name}: env: names an environment variable")
    return headers


def env_names_of(headers: Mapping[str, str]) -> list[str]:
    """The environment variables ``env:NAME`` header values read."""
    return [v[len(ENV_PREFIX) :] for v in headers.values() if _is_env(v)]


def check_env_name(name: str | None, what: str) -> str | None:
    """``name`` if it can be an environment variable's name (``ValueError`` if not)."""
    if name is not None and not ENV_NAME.fullmatch(name):
        raise ValueError(f"{what} names an environment variable, got {name!r}")
    return name


def _is_env(value: str) -> bool:
    return value.startswith(ENV_PREFIX)


def _check_path(path: str | None) -> str | None:
    if path is not None and not _PATH.match(path):
        raise ValueError(f"a dotted path into the body, like 'properties', is needed: {path!r}")
    return path


def _check_identifier(column: str) -> str:
    if not _IDENTIFIER.match(column):
        raise ValueError(f"not a column name (letters, digits, _): {column!r}")
    return column


class EtagResourceConfig(HttpResourceConfig):
    """An HTTP resource with ETags: GET, then PATCH or PUT with ``If-Match``; created with
    PUT and ``If-None-Match: *``. ``write = "put"`` sends the whole body as read, with
    the change merged in."""

    kind: Literal["etag"]
    write: Literal["patch", "put"] = "patch"


class StampedResourceConfig(HttpResourceConfig):
    """An HTTP resource without versions: the record's last-edited stamp (``stamp_at``)
    or, without one, its fields' values are compared right before each write."""

    kind: Literal["stamped"]
    stamp_at: str | None = None
    write: Literal["patch", "put"] = "patch"  # the method that sends the changed fields only

    @field_validator("stamp_at")
    @classmethod
    def _check_stamp(cls, path: str | None) -> str | None:
        return _check_path(path)


class PgTableResourceConfig(_Strict):
    """The user's own PostgreSQL table: a row per record, a version column it keeps."""

    kind: Literal["pg_table"]
    url_env: str
    table: str
    key_column: str = "id"
    key: str = "{key}"
    version_column: str
    version_kind: Literal["integer", "timestamp"] = "integer"
    columns: dict[str, str] = Field(min_length=1)  # field -> column

    @field_validator("url_env")
    @classmethod
    def _check_env(cls, name: str) -> str:
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"url_env names an environment variable, got {name!r}")
        return name

    @field_validator("table")
    @classmethod
    def _check_table(cls, table: str) -> str:
        parts = table.split(".")
        if len(parts) > 2 or not all(_IDENTIFIER.match(p) for p in parts):
            raise ValueError(f"table is 'name' or 'schema.name' (letters, digits, _): {table!r}")
        return table

    @field_validator("key_column", "version_column")
    @classmethod
    def _check_column(cls, column: str) -> str:
        return _check_identifier(column)

    @field_validator("key")
    @classmethod
    def _check_key(cls, template: str) -> str:
        return check_key_template(template)

    @field_validator("columns")
    @classmethod
    def _check_columns(cls, columns: dict[str, str]) -> dict[str, str]:
        for field, column in columns.items():
            check_field_name(field)
            _check_identifier(column)
        if len(set(columns.values())) != len(columns):
            raise ValueError("two fields map to one column")
        return columns

    @property
    def schema_and_table(self) -> tuple[str | None, str]:
        """(schema or None for the search path, table name)."""
        schema, _, name = self.table.rpartition(".")
        return (schema or None), name

    def url(self, environ: Mapping[str, str]) -> str:
        """The database URL, from ``url_env`` (``ConfigError`` names it when unset)."""
        url = environ.get(self.url_env)
        if not url:
            raise ConfigError(f"environment variable {self.url_env} not set")
        return url


ResourceConfig = Annotated[
    EtagResourceConfig | PgTableResourceConfig | StampedResourceConfig,
    Field(discriminator="kind"),
]
#: The kinds of destination that hold records (one resource class each).
ResourceKind = Literal["etag", "pg_table", "stamped"]
RESOURCE_KINDS: tuple[str, ...] = get_args(ResourceKind)


class _OneResource(_Strict):
    resource: ResourceConfig


def parse_resource(name: str, table: Mapping[str, object]) -> ResourceConfig:
    """A ``[destinations.<name>]`` table of a version-checked kind; ``ConfigError`` says
    what is wrong, naming the destination."""
    kind = table.get("kind")
    if kind not in RESOURCE_KINDS:
        raise ConfigError(
            f"destination {name}: kind must be one of {', '.join(RESOURCE_KINDS)}, got {kind!r}"
        )
    try:
        return _OneResource(resource=dict(table)).resource
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][2:]) or 'table'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"destination {name} ({kind}): {problems}") from None

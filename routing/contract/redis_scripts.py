"""Both sides' Redis scripts, as text: the one loader, the one error mapping, and the layouts
Python and Lua share.

Why here, below both gateways: the producers' gateway (``producers/gateway/``) and the lanes'
broker (``workers/brokers/redis.py``) never import each other, and this layer imports no
client library. So what is plain text and plain Python is written once, here: finding a
script by name in the folder beside its gateway, putting before it the helper it includes
and the constants generated from the Python that names the layouts (:data:`MESSAGE_NOTES`,
:data:`SHARD_KEYS`, :data:`COMMON_KEYS`), and turning a client error into
:class:`BrokerUnavailable`. What needs the client stays in the gateways and is redis-py's
own: each hands the text to ``register_script`` (``EVALSHA``; on ``NOSCRIPT``, ``SCRIPT
LOAD`` and again) and passes its client's error class to :func:`errors_as_unavailable`.

The convention of a script folder (``tests/test_redis_scripts.py`` checks it):

* one file a script, ``<name>.lua``, run by that name by the gateway beside the folder;
  a file named ``_<name>.lua`` is a helper, never run alone;
* a script's first comment lines say what it does and name its ``KEYS`` and ``ARGV``;
* a script whose first line is ``-- include: _<helper>.lua`` is run with the generated
  constants and that helper before it (Redis scripts cannot call each other); no script
  spells a note or a key position the constants name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cache
from importlib import resources

from ..redis_keys import MESSAGE_NOTES, SEEN_PERIOD_MS
from .errors import BrokerUnavailable

#: The keys of one shard a lane script is given, in this order: each is the field of that
#: name in the table ``shard_keys()`` of ``_shared.lua`` builds (``rec_prefix``: a key name
#: used as a prefix only).
SHARD_KEYS = ("lease", "queue", "rec_prefix", "ready", "busy", "waits", "deliveries")
#: The deployment's keys a lane script is given at the end of its ``KEYS``, in this order.
COMMON_KEYS = ("depth", "held", "counters", "backlog")
#: The values of one acknowledged message in ``finish.lua``'s ``ARGV``, in this order:
#: ``ARGV[i + ACK.<name>]`` there, ``i`` the message's first (``told_key`` '': nothing told).
ACK_ARGS = (
    *("message", "outcome", "conflicts", "attempts", "latency_bucket", "latency_s"),
    *("told_key", "told", "told_ttl_ms", "told_replace", "backlog_source"),
)
#: The first line by which a script includes a helper of its folder.
INCLUDE = "-- include: "


def lua_constants() -> str:
    """The Lua definitions of the layouts Python names: ``NOTES`` (note name -> the suffix
    of its field in a shard's deliveries hash), ``SHARD_KEYS`` and ``COMMON_KEYS`` (the key
    names, by position), ``ACK`` (an acknowledged message's values: name -> offset,
    see :data:`ACK_ARGS`), ``SEEN_PERIOD_MS`` (the remembered ids' period,
    :meth:`~keylane.routing.redis_keys.RedisKeys.seen_ids`)."""
    notes = ", ".join(f"{note} = ':{note}'" for note in MESSAGE_NOTES)
    ack = ", ".join(f"{name} = {i}" for i, name in enumerate(ACK_ARGS))
    return (
        "-- Generated from keylane.routing.contract.redis_scripts (do not spell these by hand).\n"
        f"local NOTES = {{{notes}}}\n"
        f"local SHARD_KEYS = {_lua_list(SHARD_KEYS)}\n"
        f"local COMMON_KEYS = {_lua_list(COMMON_KEYS)}\n"
        f"local ACK = {{{ack}}}\n"
        f"local SEEN_PERIOD_MS = {SEEN_PERIOD_MS}\n"
    )


def _lua_list(names: tuple[str, ...]) -> str:
    return "{" + ", ".join(f"'{name}'" for name in names) + "}"


class ScriptFolder:
    """The Lua scripts of one folder beside its gateway, each loaded by name."""

    def __init__(self, package: str, folder: str) -> None:
        self.package = package
        self.folder = folder

    def names(self) -> list[str]:
        """The scripts of the folder (its helpers apart)."""
        files = resources.files(self.package).joinpath(self.folder).iterdir()
        stems = (f.name.removesuffix(".lua") for f in files if f.name.endswith(".lua"))
        return sorted(stem for stem in stems if not stem.startswith("_"))

    def source(self, name: str) -> str:
        """The text Redis runs for script ``name``: ``<folder>/<name>.lua``, with the
        generated constants and the helper it includes before it."""
        return _source(self.package, self.folder, name)


@cache
def _source(package: str, folder: str, name: str) -> str:
    text = _read(package, folder, name)
    first = text.partition("\n")[0]
    if not first.startswith(INCLUDE):
        return text
    helper = first.removeprefix(INCLUDE).strip().removesuffix(".lua")
    return f"{lua_constants()}{_read(package, folder, helper)}\n{text}"


def _read(package: str, folder: str, name: str) -> str:
    return resources.files(package).joinpath(folder, f"{name}.lua").read_text()


@contextlib.contextmanager
def errors_as_unavailable(client_error: type[Exception]) -> Iterator[None]:
    """Turn any ``client_error`` raised inside the block (sync or ``await``-ed) into
    :class:`BrokerUnavailable`: the rest of keylane sees one error for a Redis outage, and
    the receiver answers 503."""
    try:
        yield
    except client_error as exc:
        raise BrokerUnavailable(f"Redis: {exc}") from exc

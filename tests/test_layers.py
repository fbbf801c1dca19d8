"""The house: imports run one way, and Redis is reached through one gateway per side.

    ops  ->  producers | workers  ->  routing.contract  ->  routing

``keylane`` (the public import for user code) sits on top and may import anything; nothing
inside keylane imports it back. producers and workers never import each other. These
tests read every module's imports (including those inside functions) from the source.

``routing/`` (the routing functions and the shared contract) holds models and parsing
only: no I/O, no user code, no state of the process. A module there
* uses no name that starts with one of :data:`PURE_FORBIDDEN`: the client libraries and
  frameworks, the network (``socket``, ``ssl``, ``http``, ``urllib.request``, ``asyncio``),
  processes and signals (``subprocess``, ``multiprocessing``, ``signal``, ``os.kill``,
  ``os.system``, ...) and what loads code by name (``importlib.import_module``,
  ``pkgutil``, ``runpy``, ``__import__``) — as imported, or as ``module.attribute``;
* calls no Redis command (a method named as one, :data:`REDIS_COMMANDS`: queuing reads
  on a pipeline is the gateways' work);
* keeps no registry: no function changes a dict, list or set bound at module level
  (item assignment or deletion, a mutating method, or ``global``).
Reading the environment and the sources file, logging, and package data read with
``importlib.resources`` are allowed: the settings and the sources are parsed there.
"""

from __future__ import annotations

import ast
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {folder: f"keylane.{folder}" for folder in ("routing", "producers", "workers", "ops")}
RANK = {"routing": 0, "contract": 1, "producers": 2, "workers": 2, "ops": 3, "public": 4}
#: The only modules that import the Redis client, per side: the producers' gateway package
#: (a module per concept), the lanes' Redis broker (redis.py and its parts), and in ops the
#: deployment view (benchmarks drive Redis directly; the embedded server's supervisor pings
#: the server it runs over a plain socket, so that a command that never uses Redis does not
#: import it).
REDIS_IMPORTERS = {
    "keylane.producers.gateway.count_flush",
    "keylane.producers.gateway.door_log",
    "keylane.producers.gateway.outcome_feed",
    "keylane.producers.gateway.queue_reads",
    "keylane.producers.gateway.receiver_gateway",
    "keylane.producers.gateway.redis_calls",
    "keylane.producers.gateway.schedule_gateway",
    "keylane.workers.brokers.redis",
    "keylane.workers.brokers.redis_calls",
    "keylane.workers.brokers.redis_leases",
    "keylane.ops.deployment_view",
}
#: The only modules that open AMQP connections, one per side: the RabbitMQ lane broker's
#: AMQP link (py-amqp through kombu) and the receiver's confirming publisher (aiormq). (Celery's own
#: configuration, ``workers.app`` and ``workers.worker``, names kombu queues only.)
AMQP_IMPORTERS = {"keylane.producers.amqp", "keylane.workers.brokers.rabbitmq.link"}
#: What routing/ may not use (a name that matches one, or is under it; ``*``: any rest of
#: the name): I/O clients and frameworks, the network, processes and signals, and loading
#: code by name.
PURE_FORBIDDEN = (
    *("redis", "celery", "kombu", "amqp", "aiormq", "pamqp", "pika", "psycopg", "sqlite3"),
    *("starlette", "httpx", "sentry_sdk", "flower"),
    *("socket", "ssl", "http", "urllib.request", "asyncio"),
    *("subprocess", "multiprocessing", "signal", "os.kill", "os.killpg", "os.system"),
    *("os.popen", "os.fork*", "os.exec*", "os.spawn*", "os.posix_spawn*", "os._exit"),
    *("importlib.import_module", "pkgutil", "runpy", "__import__"),
)
#: Redis commands by their client method names, those no dict or list shares (a module
#: calling one does a gateway's I/O on a client or pipeline it was handed).
REDIS_COMMANDS = frozenset(
    {
        *("hget", "hset", "hgetall", "hincrby", "hlen", "hdel", "hmget", "hexists"),
        *("zcard", "zadd", "zrange", "zrangebyscore", "zrem", "zscore"),
        *("lpush", "rpush", "lpop", "rpop", "llen", "lindex", "lrange", "lrem"),
        *("smembers", "sadd", "srem", "scard", "sismember", "incrby", "pexpire", "setnx"),
        *("evalsha", "register_script", "pipeline", "execute_command", "xadd", "publish"),
    }
)
#: Methods that change a dict, list or set in place.
MUTATORS = frozenset(
    {
        *("append", "extend", "insert", "remove", "pop", "popitem", "clear", "update"),
        *("setdefault", "add", "discard", "sort", "reverse", "__setitem__", "__delitem__"),
    }
)


def modules() -> dict[str, Path]:
    """Every keylane module, by dotted name."""
    found = {"keylane": REPO / "keylane" / "__init__.py"}
    for path in (REPO / "keylane").glob("*.py"):
        if path.stem != "__init__":
            found[f"keylane.{path.stem}"] = path
    for folder, package in FOLDERS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def layer(module: str) -> str:
    """The layer a keylane module belongs to."""
    if module == "keylane" or module.split(".")[1] not in FOLDERS:
        return "public"
    if module.startswith("keylane.routing.contract"):
        return "contract"
    return module.split(".")[1]


def imports(path: Path) -> list[str]:
    """The absolute module names ``path`` imports (anywhere in the file); a relative
    import is resolved against the package the file is in."""
    package = PACKAGES[path].split(".")
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1]
            if node.module:
                names.append(".".join([*base, node.module]))
            else:  # from . import a, b: each name may be a module of the package
                names += [".".join([*base, alias.name]) for alias in node.names]
    return names


MODULES = modules()
#: The package each module's relative imports start from.
PACKAGES = {
    path: module if path.name == "__init__.py" else module.rpartition(".")[0]
    for module, path in MODULES.items()
}


def test_every_folder_is_found() -> None:
    # Given the four folders and the public package, Then each has modules to check
    assert {layer(m) for m in MODULES} == set(RANK)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_one_way_down_the_house(module: str) -> None:
    # Given a keylane module, When its imports are read
    here = layer(module)
    wrong = []
    for name in imports(MODULES[module]):
        top = name.split(".")[0]
        if top in FOLDERS or top == "tests":
            wrong.append(f"{name} (import it as keylane.{name})" if top != "tests" else name)
            continue
        if top != "keylane":
            continue
        there = layer(name) if name != "keylane" else "public"
        if there == "public" and here != "public":
            wrong.append(f"{name} (the public import is for user code)")
        elif {here, there} == {"producers", "workers"}:
            wrong.append(f"{name} ({here} and {there} never import each other)")
        elif RANK[there] > RANK[here]:
            wrong.append(f"{name} (runs back up: {here} -> {there})")
    # Then none of them runs back up the house
    assert wrong == [], f"{module} imports {wrong}"


def used_names(path: Path) -> set[str]:
    """The dotted names a module uses from outside itself: each import (``os``,
    ``importlib.resources``) and each ``name.attribute`` chain on an imported name
    (``os.kill``, ``importlib.import_module``), resolved through ``as`` and ``from``."""
    tree = ast.parse(path.read_text(), str(path))
    bound: dict[str, str] = {}
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
                used.add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                used.add(f"{node.module}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute | ast.Name):
            chain = []
            while isinstance(node, ast.Attribute):
                chain.append(node.attr)
                node = node.value
            if isinstance(node, ast.Name) and (node.id in bound or node.id == "__import__"):
                used.add(".".join([bound.get(node.id, node.id), *reversed(chain)]))
    return used


def redis_commands(path: Path) -> set[str]:
    """The Redis commands a module calls by their client method names."""
    return {
        node.func.attr
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in REDIS_COMMANDS
    }


def registries(path: Path) -> set[str]:
    """Module-level dicts, lists and sets that a function of the module changes."""
    tree = ast.parse(path.read_text(), str(path))
    containers = {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign) and is_container(node.value)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    changed = set()
    for function in (n for n in ast.walk(tree) if isinstance(n, functions)):
        for node in ast.walk(function):
            if isinstance(node, ast.Global):
                changed |= set(node.names)
            elif isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
                changed.add(getattr(node.value, "id", ""))
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") in MUTATORS:
                changed.add(getattr(getattr(node.func, "value", None), "id", ""))
    return containers & changed


def is_container(value: ast.expr | None) -> bool:
    """Whether ``value`` makes a dict, list or set (a display, a comprehension, a call)."""
    displays = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return value.func.id in ("dict", "list", "set", "defaultdict", "OrderedDict")
    return isinstance(value, displays)


BOTTOM = sorted(m for m in MODULES if layer(m) in ("routing", "contract"))


@pytest.mark.parametrize("module", BOTTOM)
def test_the_bottom_layers_do_no_io(module: str) -> None:
    # Given a module of routing or the shared contract, When the names it uses are read
    path = MODULES[module]
    forbidden = sorted(
        name
        for name in used_names(path)
        if any(fnmatchcase(name, f) or fnmatchcase(name, f"{f}.*") for f in PURE_FORBIDDEN)
    )
    # Then it uses no client, network, process or code-loading name
    assert forbidden == [], f"{module} uses {forbidden}"
    # And it calls no Redis command
    assert redis_commands(path) == set(), f"{module} calls Redis"
    # And it keeps no registry a function changes
    assert registries(path) == set(), f"{module} keeps a mutable module-level registry"


def test_redis_is_reached_through_one_gateway_per_side() -> None:
    # Given every shipped module (benchmarks are not shipped)
    importers = {
        module
        for module, path in MODULES.items()
        if not module.startswith("keylane.ops.bench")
        and any(name.split(".")[0] == "redis" for name in imports(path))
    }
    # Then only the gateways import the Redis client
    assert importers == REDIS_IMPORTERS


#: Each outside client library and the only modules that import it (one per part that
#: talks to that outside: the HTTP forward and HTTP records, keylane's PostgreSQL store and
#: the user's own table).
CLIENT_IMPORTERS = {
    "httpx": {"keylane.workers.destinations.http_forward", "keylane.workers.resources.http"},
    "psycopg": {"keylane.workers.stores.postgres", "keylane.workers.resources.pg_table"},
    "sqlite3": {"keylane.workers.stores.sqlite"},
}


@pytest.mark.parametrize("library", sorted(CLIENT_IMPORTERS))
def test_each_client_library_has_its_own_modules(library: str) -> None:
    # Given every shipped module below ops (the health check and benchmarks call out too)
    importers = {
        module
        for module, path in MODULES.items()
        if not module.startswith("keylane.ops")
        and any(name.split(".")[0] == library for name in imports(path))
    }
    # Then only the modules of the parts that talk to that outside import the library
    assert importers == CLIENT_IMPORTERS[library]


def test_amqp_is_reached_through_one_module_per_side() -> None:
    # Given every keylane module, When the ones that import an AMQP client (py-amqp or
    # kombu's connection, aiormq or its protocol layer pamqp) are listed
    clients = ("amqp", "kombu.connection", "kombu.transport", "aiormq", "pamqp")
    found = {
        module
        for module, path in MODULES.items()
        if any(name == c or name.startswith(f"{c}.") for name in imports(path) for c in clients)
    }
    # Then they are the RabbitMQ broker and the receiver's publisher
    assert found == AMQP_IMPORTERS

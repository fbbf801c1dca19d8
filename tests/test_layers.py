"""The house: imports run one way, and Redis is reached through one gateway per side.

    ops  ->  producers | workers  ->  routing.contract  ->  routing

``keylane`` (the public import for user code) sits on top and may import anything; nothing
inside keylane imports it back. producers and workers never import each other. These
tests read every module's imports (including those inside functions) from the source.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {folder: f"keylane.{folder}" for folder in ("routing", "producers", "workers", "ops")}
RANK = {"routing": 0, "contract": 1, "producers": 2, "workers": 2, "ops": 3, "public": 4}
#: The only modules that import the Redis client, per side (the embedded server's
#: supervisor pings the server it runs; benchmarks drive Redis directly).
REDIS_IMPORTERS = {
    "keylane.producers.gateway",
    "keylane.workers.brokers.redis",
    "keylane.ops.deployment_view",
    "keylane.ops.embedded_redis",
}
#: The only modules that open AMQP connections, one per side: the RabbitMQ lane broker's
#: AMQP link (py-amqp through kombu) and the receiver's confirming publisher (aiormq). (Celery's own
#: configuration, ``workers.app`` and ``workers.worker``, names kombu queues only.)
AMQP_IMPORTERS = {"keylane.producers.amqp", "keylane.workers.brokers.rabbitmq.link"}
#: What the bottom layers may not import: I/O clients and frameworks.
PURE_FORBIDDEN = ("redis", "celery", "kombu", "psycopg", "sqlite3", "starlette", "httpx")


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


BOTTOM = sorted(m for m in MODULES if layer(m) in ("routing", "contract"))


@pytest.mark.parametrize("module", BOTTOM)
def test_the_bottom_layers_do_no_io(module: str) -> None:
    # Given a module of routing or the shared contract
    clients = [
        name
        for name in imports(MODULES[module])
        if name.split(".")[0] in PURE_FORBIDDEN and module not in REDIS_IMPORTERS
    ]
    # Then it imports no client library or framework
    assert clients == [], f"{module} imports {clients}"


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

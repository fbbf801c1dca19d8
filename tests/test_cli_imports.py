"""A short command imports what it uses (issue 48): ``keylane records get`` and
``keylane --help`` load neither the receiver nor the lanes nor a client library they do
not call, and ``import keylane`` loads none of keylane's modules until a public name is
used.

Each check runs a fresh interpreter and looks at ``sys.modules`` after the command ran: a
property of the imports, not a timing, so it holds on a busy machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from keylane.ops.outside_edit import edit_record
from keylane.workers.stores import open_store
from tests.support.stack import REPO

#: What a command that reads the store has no use for: the brokers' clients, Celery, the
#: receiver's web stack, Sentry, metrics, the HTTP clients, PostgreSQL's driver on SQLite,
#: the receiver's and the lanes' own modules. (asyncio is not among them: pydantic-settings,
#: which the settings are built on, imports it.)
HEAVY = (
    *("celery", "kombu", "amqp", "aiormq", "pamqp", "redis", "hiredis"),
    *("starlette", "uvicorn", "httpx", "httpcore", "sentry_sdk", "prometheus_client"),
    *("psycopg", "msgspec", "python_multipart", "defusedxml"),
    *("keylane.api", "keylane.producers", "keylane.workers.lanes", "keylane.workers.app"),
    *("keylane.routing.contract.sources", "keylane.routing.contract.events"),
)

#: Runs the ``keylane`` command in this interpreter, then prints the heavy modules loaded.
RUN_THEN_LIST = """
import json, sys
from keylane.ops.cli import main
heavy = json.loads(sys.argv[2])
sys.argv = ["keylane", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
loaded = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in heavy))
print(json.dumps({"code": code, "loaded": loaded}), file=sys.stderr)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYLANE_")}
    return {**env, "PYTHONPATH": str(REPO), "COLUMNS": "100", **extra}


def _store_with_a_record(data_dir: Path) -> None:
    store = open_store(f"sqlite:///{data_dir / 'keylane.sqlite3'}")
    try:
        store.migrate()
        edit_record(store, "contact:42", {"email": "a@b.c"}, [])
    finally:
        store.close()


def _run_then_list(
    args: list[str], cwd: Path, heavy: tuple[str, ...] = HEAVY, **env: str
) -> tuple[int, list[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", RUN_THEN_LIST, json.dumps(args), json.dumps(heavy)],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    return report["code"], report["loaded"], done.stdout


def test_records_get_imports_no_broker_client_receiver_or_lanes(
    tmp_path: Path, redis_url: str
) -> None:
    # Given a deployment's data directory with its SQLite store, a record in it, and the
    # URL file of a running embedded Redis (as `keylane up` leaves it: the command looks)
    data_dir = tmp_path / "keylane-data"
    _store_with_a_record(data_dir)
    (data_dir / "redis").mkdir()
    (data_dir / "redis" / "url").write_text(redis_url + "\n")
    # When `keylane records get` reads it
    code, loaded, out = _run_then_list(["records", "get", "contact:42", "--json"], tmp_path)
    # Then it printed the record, and loaded none of the heavy modules
    assert code in (0, None), out
    assert json.loads(out)["fields"] == {"email": "a@b.c"}
    assert loaded == []


#: What ``keylane status`` has no use for: it reads Redis (the client, the lanes' Redis
#: broker's reads, the producers' reads of flow and schedule state) and the store, and
#: nothing of RabbitMQ, the receiver, the lanes' work, Sentry or triage.
STATUS_HEAVY = (
    *("celery", "kombu", "amqp", "aiormq", "pamqp", "starlette", "uvicorn", "httpx"),
    *("httpcore", "sentry_sdk", "prometheus_client", "psycopg", "python_multipart"),
    *("keylane.api", "keylane.producers.receiver", "keylane.producers.amqp"),
    *("keylane.producers.accept", "keylane.workers.lanes", "keylane.workers.app"),
    *("keylane.workers.merges", "keylane.workers.brokers.rabbitmq", "keylane.ops.triage"),
    "keylane.routing.contract.sources",
)


def test_status_imports_neither_rabbitmq_nor_the_receiver_nor_the_lanes(
    tmp_path: Path, redis_url: str, namespace: str
) -> None:
    # Given a deployment's store and its Redis (an empty namespace of the test Redis)
    _store_with_a_record(tmp_path / "keylane-data")
    # When `keylane status` reports on it
    args = ["status", "--json", "--redis-url", redis_url]
    code, loaded, out = _run_then_list(args, tmp_path, STATUS_HEAVY, KEYLANE_NAMESPACE=namespace)
    # Then it reported, and loaded none of what it does not use
    assert code in (0, None), out
    assert json.loads(out)["shards"]
    assert loaded == []


def test_help_imports_no_subcommand_module(tmp_path: Path) -> None:
    # When `keylane --help` lists the commands
    modules = ("keylane.ops.cli_", "keylane.workers", "keylane.ops.status")
    code, loaded, out = _run_then_list(["--help"], tmp_path, (*HEAVY, *modules))
    # Then it imported none of them (the lazy group's module aside), and listed them all
    assert code == 0
    assert [m for m in loaded if m != "keylane.ops.cli_common" and "cli_lazy" not in m] == []
    assert re.search(r"\n  records +List records, read one, or edit one", out), out
    assert re.search(r"\n  deliveries +Deliveries kept \(turned away", out), out


LISTINGS = """
import click, json
from keylane.ops.cli import cli
def listing(width):
    ctx = click.Context(cli, info_name="keylane", terminal_width=width, max_content_width=width)
    return cli.get_help(ctx)
lazy = {w: listing(w) for w in (60, 80, 100, 140)}
for name in cli.lazy:
    cli.get_command(click.Context(cli), name)
print(json.dumps({"lazy": lazy, "loaded": {w: listing(w) for w in lazy}}))
"""


def test_the_help_list_says_what_each_command_once_imported_says() -> None:
    # Given `keylane --help` at several widths before any subcommand is imported, and again
    # after every one is
    done = subprocess.run(
        [sys.executable, "-c", LISTINGS], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    # Then the two say the same: each short help kept in the lazy list is the command's own
    assert shown["lazy"] == shown["loaded"]


PUBLIC = """
import json, sys
import keylane
before = sorted(m for m in sys.modules if m.startswith("keylane."))
from keylane import *
names = {name: getattr(keylane, name) is globals()[name] for name in keylane.__all__}
lazy, api = sorted(keylane._HOME_OF), "keylane.api" in sys.modules
print(json.dumps({"before": before, "names": names, "lazy": lazy, "api": api}))
"""


def test_import_keylane_loads_each_public_name_when_it_is_used() -> None:
    # When user code imports keylane, then takes every public name
    done = subprocess.run(
        [sys.executable, "-c", PUBLIC], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    # Then the import alone loaded none of keylane's modules, and every name resolves
    assert shown["before"] == []
    assert shown["api"] is True
    assert all(shown["names"].values())
    assert shown["lazy"] == sorted(set(shown["names"]) - {"__version__"})


def test_the_benchmarks_page_s_import_commands_run_as_written(tmp_path: Path) -> None:
    # Given the commands of the benchmarks page's section on short commands, and a
    # deployment's folder with contact:42 in its store
    if shutil.which("time", path="/usr/bin") is None:
        pytest.skip("no /usr/bin/time here")
    page = (REPO / "ops" / "docs" / "benchmarks.md").read_text()
    section = page.split("## Short commands", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    _store_with_a_record(tmp_path / "keylane-data")
    # When a shell runs them, with this interpreter's python and keylane first on PATH
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.group(1)],
        cwd=tmp_path,
        env=_env(PATH=path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Then each says what it measures
    assert done.returncode == 0, done.stderr
    assert "keylane.ops.cli" in done.stderr or "keylane.ops.cli" in done.stdout
    assert re.search(r"^[0-9.e-]+ s importing$", done.stdout, re.M), done.stdout
    assert "contact:42  revision 1" in done.stdout
    assert re.search(r"s wall, [0-9.]+ \+ [0-9.]+ s CPU", done.stderr), done.stderr

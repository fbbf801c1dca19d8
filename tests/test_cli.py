"""The ``keylane`` command as a newcomer meets it: its version, its answers to a bad setting,
and commands run from a folder that holds no deployment."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from importlib.metadata import version
from pathlib import Path

import psycopg
import pytest

from keylane.ops.outside_edit import edit_record
from keylane.workers.store_rows import DeadLetterDraft
from keylane.workers.stores import open_store
from tests.support.readme import keylane_command
from tests.support.services import free_port
from tests.support.stack import REPO


def _run(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*keylane_command(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def _bare_env() -> dict[str, str]:
    """The environment of a shell with no KEYLANE_* variable set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYLANE_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def test_keylane_version(tmp_path: Path) -> None:
    shown = _run("--version", cwd=tmp_path, env=_bare_env())
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"keylane {version('keylane')}"


@pytest.mark.parametrize(
    ("args", "environ", "expected"),
    [
        (["--shards", "0", "status"], {}, "--shards / KEYLANE_SHARD_COUNT: must be at least 1"),
        (["status"], {"KEYLANE_SHARD_COUNT": "abc"}, "KEYLANE_SHARD_COUNT: must be a whole number"),
        (["--log-level", "LOUD", "status"], {}, "--log-level / KEYLANE_LOG_LEVEL: must be one of"),
        (["status"], {"KEYLANE_HEARTBEAT_MS": "9000"}, "KEYLANE_HEARTBEAT_MS (9000) must be at"),
    ],
)
def test_a_bad_setting_names_its_option_and_variable(
    tmp_path: Path, args: list[str], environ: dict[str, str], expected: str
) -> None:
    # When a command gets a setting that cannot work
    refused = _run(*args, cwd=tmp_path, env={**_bare_env(), **environ})
    # Then it exits 2 saying what is wrong in the words a user typed, not pydantic's
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert expected in refused.stderr
    for leak in ("validation error", "pydantic", "shard_count", "heartbeat_ms", "Traceback"):
        assert leak not in refused.stderr, refused.stderr


READ_COMMANDS = [
    ["records", "get", "contact:42"],
    ["records", "set", "contact:42", "owner=ada"],
    ["dlq", "list"],
    ["dlq", "show", "1"],
    ["dlq", "stats"],
    ["dlq", "export"],
]


def test_commands_run_from_another_folder_create_nothing_and_say_where_they_looked(
    tmp_path: Path,
) -> None:
    # Given a deployment's data directory holding contact:42 (its store made, as keylane up
    # makes it), and another folder holding nothing
    home = tmp_path / "project"
    store = open_store(f"sqlite:///{home / 'keylane-data' / 'keylane.sqlite3'}")
    store.migrate()
    edit_record(store, "contact:42", {"email": "a@b.c"})
    store.close()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _bare_env()
    # When each command runs in the other folder
    for args in READ_COMMANDS:
        answer = _run(*args, cwd=elsewhere, env=env)
        # Then it says it found no store, where it looked and how to point it at one
        assert answer.returncode == 2, (args, answer.stdout, answer.stderr)
        assert f"no keylane store at {elsewhere / 'keylane-data' / 'keylane.sqlite3'}" in (
            answer.stderr
        ), answer.stderr
        assert "--data-dir" in answer.stderr
    for args in (["status"], ["check"], ["audit"]):
        answer = _run(*args, cwd=elsewhere, env=env)
        assert answer.returncode != 0, (args, answer.stdout)
        assert f"data directory {elsewhere / 'keylane-data'}" in answer.stdout + answer.stderr
    # And it left nothing behind
    assert list(elsewhere.iterdir()) == []
    # And given the data directory, the same command finds the record
    found = _run(
        "--data-dir",
        str(home / "keylane-data"),
        "records",
        "get",
        "contact:42",
        cwd=elsewhere,
        env=env,
    )
    assert found.returncode == 0, found.stderr
    assert 'email = "a@b.c"' in found.stdout


def test_a_command_on_a_postgresql_schema_without_keylane_tables_creates_none(
    tmp_path: Path, pg_url: str
) -> None:
    # Given a PostgreSQL schema where no keylane worker ever started
    schema = f"kltest_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        url = f"{pg_url}{'&' if '?' in pg_url else '?'}options=-csearch_path%3D{schema}"
        # When a command reads from it
        answer = _run(
            "records", "get", "contact:42", cwd=REPO, env={**_bare_env(), "KEYLANE_STORE_URL": url}
        )
        # Then it says the database has no keylane tables, and creates none
        assert answer.returncode == 2, answer.stdout + answer.stderr
        assert "has no keylane tables" in answer.stderr
        assert "KEYLANE_STORE_URL" in answer.stderr
        with psycopg.connect(pg_url) as conn:
            tables = conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            ).fetchone()
        assert tables == (0,)
        # And once a worker has made them (migrate), they are in that schema, as README's
        # ?options=-csearch_path%3D... says
        store = open_store(url)
        store.migrate()
        store.close()
        with psycopg.connect(pg_url) as conn:
            names = conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            ).fetchall()
        assert {n for (n,) in names} == {
            "records",
            "journal",
            "shard_fences",
            "dead_letters",
            "identities",
            "kept_apart",
            "archived_ids",
            "parked",
            "tries",
            "held",
            "deliveries",
        }
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_records_get_exits_1_for_a_missing_record_with_json_or_without(tmp_path: Path) -> None:
    # Given a store that holds contact:42 and nothing else
    store = open_store(f"sqlite:///{tmp_path / 'keylane-data' / 'keylane.sqlite3'}")
    store.migrate()
    edit_record(store, "contact:42", {"email": "a@b.c"})
    store.close()
    env = _bare_env()
    for as_json in ([], ["--json"]):
        # When a record that is not there is asked for, as text and as JSON
        missing = _run("records", "get", "contact:7", *as_json, cwd=tmp_path, env=env)
        # Then the exit code is 1 (as the help says) and the answer says it is absent
        assert missing.returncode == 1, (as_json, missing.stdout, missing.stderr)
        # And the record that is there exits 0
        found = _run("records", "get", "contact:42", *as_json, cwd=tmp_path, env=env)
        assert found.returncode == 0, (as_json, found.stdout, found.stderr)
    missing = _run("records", "get", "contact:7", "--json", cwd=tmp_path, env=env)
    assert json.loads(missing.stdout)["exists"] is False
    assert "no such record" in _run("records", "get", "contact:7", cwd=tmp_path, env=env).stdout


def _no_ages(table: str) -> str:
    """A listing without its ages (``3s``) and its columns' widths: two runs a moment
    apart differ by those only (an age of ``14s`` widens its column where ``6s`` did not)."""
    return re.sub(r"[ \t]+", " ", re.sub(r"\b\d+[smhd]\b", "AGE", table))


def test_a_group_whose_listing_is_its_default_lists_when_called_alone(tmp_path: Path) -> None:
    # Given a store with one open dead letter
    store = open_store(f"sqlite:///{tmp_path / 'keylane-data' / 'keylane.sqlite3'}")
    store.migrate()
    event = {"id": "evt_8", "record_key": "contact:42", "changes": {"visits": {"increment": 1}}}
    draft = DeadLetterDraft(
        "demo", "evt_8", "contact:42", 50, "type", event, {}, 1, 1, 1, "not a number"
    )
    store.commit_dead_letter(draft, None)
    store.close()
    env = _bare_env()
    for group in ("dlq", "merges", "records"):
        # When the group is called alone, as README's `keylane merges` is
        alone = _run(group, cwd=tmp_path, env=env)
        # Then it lists, as its `list` does, instead of printing its usage (exit code 2)
        assert alone.returncode == 0, (group, alone.stdout, alone.stderr)
        listed = _run(group, "list", cwd=tmp_path, env=env)
        assert _no_ages(alone.stdout) == _no_ages(listed.stdout), (alone.stdout, listed.stdout)
        assert "Usage:" not in alone.stdout + alone.stderr
    assert "evt_8" in _run("dlq", cwd=tmp_path, env=env).stdout
    assert _run("merges", cwd=tmp_path, env=env).stdout.split()[:3] == ["ID", "CREATED", "STATUS"]
    # And its --help still lists its commands
    assert "resolve" in _run("merges", "--help", cwd=tmp_path, env=env).stdout


def test_up_check_wait_checks_again_until_its_time_is_up(tmp_path: Path) -> None:
    # Given a folder where no keylane up runs (its ports free)
    env = {**_bare_env(), "KEYLANE_PORT": str(free_port())}
    # When `keylane up --check --wait 2s` runs there
    started = time.monotonic()
    waited = _run("up", "--check", "--wait", "2s", cwd=tmp_path, env=env)
    # Then it checked until its time was up, and says what failed, exit code 1
    assert time.monotonic() - started >= 2
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "FAIL receiver" in waited.stdout
    # And --wait without --check is refused, exit code 2, saying what it goes with
    alone = _run("up", "--wait", "2s", cwd=tmp_path, env=env)
    assert alone.returncode == 2
    assert "--wait goes with --check" in alone.stderr
    assert not (tmp_path / "keylane-data").exists()

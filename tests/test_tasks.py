"""workers/tasks.py: the registry of user tasks, their record keys and the import of the
user's modules. Each test starts from an empty registry of its own."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from keylane.routing.contract.errors import ConfigError
from keylane.workers import tasks
from keylane.workers.tasks import TaskSpec, all_tasks, import_app, register, registered


@pytest.fixture(autouse=True)
def empty_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "_TASKS", {})


def sync_contact(event: Any) -> None:
    pass


def sync_company(event: Any) -> None:
    pass


def test_a_task_is_registered_under_its_functions_name_and_listed_by_name() -> None:
    spec = register(sync_contact, key="contact:{email}")
    register(sync_company, key="company:{id}", name="a.company", batch=10, debounce_ms=500)
    assert spec == TaskSpec("sync_contact", sync_contact, "contact:{email}")
    assert registered("sync_contact") is spec
    assert registered("nothing") is None
    assert [t.name for t in all_tasks()] == ["a.company", "sync_contact"]
    assert (all_tasks()[0].batch, all_tasks()[0].debounce_ms) == (10, 500)


def test_a_key_template_reads_top_level_fields_of_the_payload() -> None:
    spec = register(sync_contact, key="contact:{email}/{n}")
    assert spec.record_key({"email": "a@b.c", "n": 2, "other": True}) == "contact:a@b.c/2"


def test_a_key_function_is_called_with_the_payload() -> None:
    spec = register(sync_contact, key=lambda p: f"c:{p[0]}")
    assert spec.record_key([7, 8]) == "c:7"


@pytest.mark.parametrize(
    ("key", "payload", "message"),
    [
        ("contact:{email}", ["a@b.c"], "needs a JSON object"),
        ("contact:{email}", {"name": "Zoë"}, "no 'email' in the payload"),
        (lambda p: "", {}, "the key is not a non-empty string: ''"),
        (lambda p: 42, {}, "the key is not a non-empty string: 42"),
    ],
)
def test_a_payload_without_a_key_is_a_value_error_naming_the_task(
    key: Any, payload: Any, message: str
) -> None:
    spec = register(sync_contact, key=key)
    with pytest.raises(ValueError, match=r"^task sync_contact: ") as raised:
        spec.record_key(payload)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "Sync Contact"}, "give the task a name=..."),
        ({"batch": 0}, "batch must be 1 to 256, not 0"),
        ({"batch": 257}, "batch must be 1 to 256, not 257"),
        ({"debounce_ms": 100}, "debounce_ms needs a batch"),
        ({"batch": 5, "debounce_ms": -1}, "debounce_ms needs a batch"),
        ({"key": "contact:42"}, "names no payload field"),
    ],
)
def test_a_task_that_cannot_work_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        register(sync_contact, **{"key": "contact:{email}", **kwargs})
    assert all_tasks() == []


def test_two_functions_under_one_name_are_refused_naming_both() -> None:
    register(sync_contact, key="c:{id}", name="sync")
    with pytest.raises(ConfigError) as raised:
        register(sync_company, key="c:{id}", name="sync")
    assert str(raised.value) == (
        "two tasks are named sync: tests.test_tasks.sync_contact, tests.test_tasks.sync_company"
    )
    kept = registered("sync")
    assert kept is not None
    assert kept.fn is sync_contact


def test_registering_again_replaces_the_spec() -> None:
    register(sync_contact, key="c:{id}")
    register(sync_contact, key="c:{id}", batch=4)
    assert [(t.name, t.batch) for t in all_tasks()] == [("sync_contact", 4)]


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """An empty working directory, and a module name no test has imported; the import
    path and the imported modules are as they were afterwards."""
    name = f"kltest_app_{uuid.uuid4().hex[:8]}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path, name
    sys.modules.pop(name, None)


def test_import_app_imports_modules_from_the_working_directory(app_dir: tuple[Path, str]) -> None:
    # Given a module next to the worker, which registers a task when imported
    folder, name = app_dir
    (folder / f"{name}.py").write_text(
        "import keylane\n\n@keylane.task(key='order:{id}')\ndef ship(order):\n    pass\n"
    )
    import_app([name])
    spec = registered("ship")
    assert spec is not None
    assert spec.record_key({"id": 9}) == "order:9"
    assert sys.path[0] == str(folder)


def test_a_module_that_is_not_there_is_named_with_where_it_was_looked_for(
    app_dir: tuple[Path, str],
) -> None:
    folder, name = app_dir
    with pytest.raises(ConfigError) as raised:
        import_app([name])
    assert str(raised.value) == (
        f"cannot import the app module {name!r}: ModuleNotFoundError: No module named "
        f"{name!r} (looked in the working directory {folder} and on the import path)"
    )


def test_a_module_that_fails_on_import_is_named_with_its_error(app_dir: tuple[Path, str]) -> None:
    folder, name = app_dir
    (folder / f"{name}.py").write_text("raise RuntimeError('no database yet')\n")
    with pytest.raises(
        ConfigError,
        match=rf"^cannot import the app module '{name}': "
        r"RuntimeError: no database yet$",
    ):
        import_app([name])

"""keylane as users install it: the wheel, a clean virtual environment, no extras.

The dev environment has every test dependency installed, which can hide a dependency
that the package forgets to declare (kombu's Redis transport needs ``packaging``, which
only kombu's ``redis`` extra declares). This test installs the wheel plainly into a new
venv, as ``pip install keylane`` and the Docker image do, and runs ``keylane up`` from
it outside the source tree.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from keylane.ops.embedded_redis import free_port
from tests.support.stack import REPO, wait_until

pytestmark = pytest.mark.slow


#: What the wheel is built from (what the Dockerfile copies).
SHIPPED = ("pyproject.toml", "README.md", "keylane", "routing", "producers", "workers", "ops")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """keylane's wheel, built from a clean copy of this checkout's shipped files (a
    ``build/`` directory left in the checkout could carry modules that no longer exist)."""
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    junk = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SHIPPED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, symlinks=True, ignore=junk)
        else:
            shutil.copy2(REPO / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("keylane-*.whl")
    return built


@pytest.fixture(scope="module")
def clean_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with only ``pip install <wheel>`` (no extras)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [venv / "bin" / "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)],
        check=True,
        capture_output=True,
    )
    return venv


def test_the_wheel_ships_one_package_and_no_tests_or_benchmarks(wheel: Path) -> None:
    # Given the wheel
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    # Then everything is under the one import name (and the wheel's metadata)
    assert {t for t in tops if not t.endswith(".dist-info")} == {"keylane"}
    # And no test or benchmark module is inside it
    assert not [n for n in names if "/tests/" in n or n.startswith("tests/")]
    assert not [n for n in names if "/bench" in n]
    # And the parts users run are there
    for module in ("keylane/ops/cli.py", "keylane/workers/lanes.py", "keylane/py.typed"):
        assert module in names


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KEYLANE_", "PYTHON"))}
    env.pop("VIRTUAL_ENV", None)
    return env


@pytest.fixture
def stack_from_clean_venv(clean_venv: Path, tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """``keylane up`` from the clean venv, on its own embedded Redis, outside the checkout."""
    keylane = clean_venv / "bin" / "keylane"
    port = free_port()
    data = tmp_path / "data"
    argv = [keylane, "up", "--data-dir", data, "--port", str(port)]
    argv += ["--flower-port", str(free_port())]
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        [str(a) for a in argv],
        cwd=tmp_path,
        env=_clean_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield data, port
    finally:
        if up.poll() is None:
            os.kill(up.pid, signal.SIGTERM)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                up.wait(10)
        log.close()


def _keylane(clean_venv: Path, cwd: Path, *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(clean_venv / "bin" / "keylane"), *(str(a) for a in args)],
        cwd=cwd,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_keylane_up_from_a_clean_install_applies_an_event(
    clean_venv: Path, stack_from_clean_venv: tuple[Path, int], tmp_path: Path
) -> None:
    # Given `keylane up` started from a clean install, with nothing configured
    data, port = stack_from_clean_venv
    log = tmp_path / "up.log"
    # When it is up (its own health check says so)
    wait_until(
        lambda: (
            _keylane(
                clean_venv, tmp_path, "up", "--check", "--data-dir", data, "--port", port
            ).returncode
            == 0
        ),
        120,
        "keylane up --check to pass",
        on_timeout=lambda: log.read_text(errors="replace"),
    )
    # And one delivery is sent to the demo source
    body = {
        "id": "evt_install_1",
        "type": "contact.updated",
        "record_key": "contact:42",
        "changes": {"visits": {"increment": 1}, "tags": {"add": "vip"}},
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/webhooks/demo",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 202

    # Then the event is applied to its record
    def record() -> dict[str, object]:
        got = _keylane(
            clean_venv, tmp_path, "records", "get", "contact:42", "--json", "--data-dir", data
        )
        return json.loads(got.stdout) if got.returncode == 0 else {}

    wait_until(
        lambda: record().get("fields") == {"visits": 1, "tags": ["vip"]},
        60,
        "the event to be applied",
        on_timeout=lambda: f"{record()}\n{log.read_text(errors='replace')}",
    )
    # And no process of the stack died on the way (keylane up would have restarted it)
    assert " exited with " not in log.read_text(errors="replace"), log.read_text(errors="replace")

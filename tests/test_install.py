"""keylane as users install it: the wheel, a clean virtual environment, no extras.

The dev environment installs exactly the versions ops/requirements-dev.txt names. Users do not: `pip
install keylane` resolves pyproject.toml's ranges afresh, today and on every later day, so
this test does too, twice:

* ``newest``: plain ``pip install <wheel>``, as users and the Docker image install; a new
  release of a dependency that breaks keylane fails here first;
* ``lowest``: ``uv pip install --resolution lowest-direct``, each direct dependency at the
  lowest version its range allows: the lower bounds are true.

Each installs the wheel into a new venv and runs ``keylane up`` from it outside the source
tree; a failing test's report starts with the versions that install resolved.
The dev environment has every test dependency installed, which could also hide a
dependency the package forgets to declare (kombu's Redis transport needs ``packaging``,
which only kombu's ``redis`` extra declares); a clean venv cannot.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.packaging import (
    build_wheel,
    dev_requirements,
    direct_requirements,
    requirement_name,
    shipped_copy,
)
from tests.support.services import free_port
from tests.support.stack import REPO, wait_until

pytestmark = pytest.mark.slow

#: How each install resolves keylane's ranges.
RESOLUTIONS = ("newest", "lowest")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """keylane's wheel, built from a clean copy of this checkout's shipped files."""
    src = shipped_copy(tmp_path_factory.mktemp("src"))
    return build_wheel(src, tmp_path_factory.mktemp("wheel"))


def _install(venv: Path, wheel: Path, resolution: str) -> None:
    if resolution == "newest":
        argv = [venv / "bin" / "pip", "install", "--quiet", "--disable-pip-version-check", wheel]
    else:
        # uv comes with the dev environment (ops/requirements-dev.txt), beside this interpreter.
        uv = Path(sys.executable).parent / "uv"
        argv = [uv, "pip", "install", "--quiet", "--resolution", "lowest-direct"]
        # keylane's own requirements named on the command line: "direct" means that, to uv;
        # named only through the wheel, they would resolve to their newest.
        argv += ["--python", venv / "bin" / "python", wheel, *direct_requirements()]
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    assert done.returncode == 0, f"{resolution} install failed:\n{done.stdout}\n{done.stderr}"


def _resolved(venv: Path) -> str:
    """``name==version`` of each of keylane's direct dependencies in ``venv``."""
    code = (
        "import sys, importlib.metadata as m\n"
        "for name in sys.argv[1:]:\n"
        "    try: print(f'{name}=={m.version(name)}')\n"
        "    except m.PackageNotFoundError: print(f'{name}: not installed')\n"
    )
    listed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code, *map(requirement_name, direct_requirements())],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout


@pytest.fixture(scope="module", params=RESOLUTIONS)
def installed(
    request: pytest.FixtureRequest, wheel: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    """A new virtual environment holding only the wheel and what it resolved (no extras),
    and the versions of keylane's direct dependencies it resolved."""
    venv = tmp_path_factory.mktemp(f"venv-{request.param}")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    _install(venv, wheel, request.param)
    return venv, f"{request.param} install resolved:\n{_resolved(venv)}"


@pytest.fixture
def clean_venv(installed: tuple[Path, str]) -> Path:
    """The clean install; its resolved versions head the test's report if it fails."""
    venv, versions = installed
    print(versions)
    return venv


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
    argv += ["--flower-port", str(free_port()), "--ops-port", str(free_port())]
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


def _stub_packages(dest: Path) -> Path:
    """A folder holding copies of the stub-only packages the dev extra names
    (``types-defusedxml`` installs ``defusedxml-stubs``), at the versions the dev
    environment has; mypy finds them on the checked interpreter's path."""
    dest.mkdir()
    site = next(Path(p) for p in sys.path if p.endswith("site-packages"))
    for requirement in dev_requirements():
        name = requirement_name(requirement)
        if name.startswith("types-"):
            stubs = name.removeprefix("types-") + "-stubs"
            shutil.copytree(site / stubs, dest / stubs)
    return dest


def test_the_type_check_passes_against_the_versions_this_install_resolved(
    clean_venv: Path, tmp_path: Path
) -> None:
    # Given the dev environment's mypy, pointed at the clean install's packages (their
    # own type information: redis-py's changes from release to release)
    mypy = Path(sys.executable).parent / "mypy"
    argv = [mypy, "--python-executable", clean_venv / "bin" / "python"]
    argv += ["--cache-dir", tmp_path / "mypy-cache"]
    # and the dev environment's stub-only packages (types-defusedxml: type information
    # only, nothing a user's install runs), on the checked interpreter's path
    env = {**os.environ, "PYTHONPATH": str(_stub_packages(tmp_path / "stubs"))}
    # When keylane is checked as configured in pyproject.toml
    checked = subprocess.run(
        [str(a) for a in argv], cwd=REPO, capture_output=True, text=True, env=env
    )
    # Then it passes: no error and no `type: ignore` depends on which allowed version is there
    assert checked.returncode == 0, checked.stdout + checked.stderr

"""A real headless browser for the web view's tests: Debian's chromium driven by its
chromedriver through selenium.

A fresh CI machine has neither: when they are absent and the tests run as root, they are
installed with ``apt-get install -y chromium chromium-driver`` (once, under a lock, so
that test processes side by side do not run apt at once); otherwise the test is skipped
and says why."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
PACKAGES = ("chromium", "chromium-driver")
INSTALL_LOCK = Path("/tmp/keylane-tests-chromium.lock")
INSTALL_TIMEOUT_S = 900


def _present() -> bool:
    return CHROMIUM.exists() and CHROMEDRIVER.exists()


def ensure_chromium() -> None:
    """Make sure chromium and chromedriver are installed, or skip the test saying why."""
    if _present():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(
            f"{CHROMIUM} and {CHROMEDRIVER} are not installed, and these tests may install "
            "them only as root with apt-get: apt-get install -y chromium chromium-driver"
        )
    with INSTALL_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be installing them
        if _present():
            return
        command = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        done = _run(command, env)
        if done.returncode != 0:  # a fresh machine's package lists may be missing or old
            _run(["apt-get", "update"], env)
            done = _run(command, env)
        if done.returncode != 0 or not _present():
            pytest.skip(f"could not install {' '.join(PACKAGES)}: {done.stdout[-2000:]}")


def _run(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        env=env,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )


@contextmanager
def headless_chromium(width: int = 1280, height: int = 900) -> Iterator[object]:
    """A headless chromium window of ``width`` x ``height`` (a selenium ``WebDriver``);
    quit when the block ends, its chromedriver stopped."""
    ensure_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespace for the sandbox
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()

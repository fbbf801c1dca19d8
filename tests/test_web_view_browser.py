"""The web view driven in a real headless browser (Debian's chromium, through selenium):
a person clicks a delivery, opens a dead letter, retries it and sees it retried and its
record changed; the pages fit a phone's width.

Its screenshots are the docs' (ops/docs/web-view.md): run it with
``KEYLANE_WRITE_SCREENSHOTS=1`` to take them again into ops/docs/; otherwise they go to
the test's own folder, and are checked there."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.browser import headless_chromium
from tests.support.readme import DOCS
from tests.support.stack import Stack, wait_until
from tests.support.web_view import HOSTILE, viewed_deployment

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

PHONE_WIDTH = 390


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _shoot(driver: WebDriver, folder: Path, name: str) -> None:
    path = folder / name
    assert driver.save_screenshot(str(path)), name
    width, _ = _png_size(path)
    assert width == driver.get_window_size()["width"], (name, width)


def _text(driver: WebDriver, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def test_a_person_clicks_a_delivery_and_retries_a_dead_letter(stack: Stack, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    shots = DOCS if os.environ.get("KEYLANE_WRITE_SCREENSHOTS") else tmp_path
    with viewed_deployment(stack) as view, headless_chromium(1280, 900) as driver:
        # Given the deliveries list, as a person opens it
        driver.get(f"{view.base}/deliveries")
        assert _text(driver, "h1") == "Deliveries"
        rows = driver.find_elements(By.CSS_SELECTOR, "tbody tr")
        assert len(rows) == 7
        _shoot(driver, shots, "web-view-deliveries.png")
        # When they click the first of demo's deliveries
        driver.find_element(By.CSS_SELECTOR, 'a[href^="/delivery?id=demo"]').click()
        # Then its page shows the request and its headers, a header that is markup as text
        wait_until(lambda: _text(driver, "h1").startswith("Delivery demo/"), 10, "its page")
        page = _text(driver, "main")
        assert "POST /webhooks/demo" in page
        assert "400 invalid" in page
        assert HOSTILE in page  # shown as text: no script ran, nothing was inserted
        assert not driver.find_elements(By.CSS_SELECTOR, "main script")
        _shoot(driver, shots, "web-view-delivery.png")
        # And an accepted delivery (kept: its event was dead-lettered) shows its event
        driver.get(f"{view.base}/deliveries?status=accepted&source=crm")
        driver.find_element(By.CSS_SELECTOR, 'a[href^="/delivery?id=crm"]').click()
        wait_until(lambda: _text(driver, "h1").startswith("Delivery crm/"), 10, "its page")
        events = _text(driver, "main table")
        assert "crm_1" in events
        assert "dead-lettered" in events
        _shoot(driver, shots, "web-view-delivery-accepted.png")
        # Given the record of the type row fixed by hand
        assert view.stack.keylane("records", "set", "contact:42", "visits=1").returncode == 0
        # When they open the dead letters, then the type row
        driver.find_element(By.LINK_TEXT, "Dead letters").click()
        wait_until(lambda: _text(driver, "h1") == "Dead letters", 10, "the list")
        assert len(driver.find_elements(By.CSS_SELECTOR, "tbody tr")) == 2
        _shoot(driver, shots, "web-view-dead-letters.png")
        typed = next(
            row
            for row in driver.find_elements(By.CSS_SELECTOR, "tbody tr")
            if " type " in f" {row.text} "
        )
        first = typed.find_element(By.CSS_SELECTOR, 'a[href^="/dead-letters/"]')
        row_id = first.text
        first.click()
        wait_until(lambda: _text(driver, "h1") == f"Dead letter {row_id}", 10, "the row")
        assert "current value is text" in _text(driver, "main")
        # and retry it with a note
        retry = driver.find_element(By.CSS_SELECTOR, "form.action:has(button.retry)")
        retry.find_element(By.NAME, "note").send_keys("visits fixed by hand")
        retry.find_element(By.CSS_SELECTOR, "button.retry").click()
        # Then the page says it was queued again, and the row is retried
        wait_until(lambda: bool(driver.find_elements(By.CSS_SELECTOR, ".notice")), 10, "notice")
        assert "queued again through its record's lane" in _text(driver, ".notice")
        assert _text(driver, "dd .badge") == "retried"
        _shoot(driver, shots, "web-view-dead-letter.png")
        # And the record it links to shows the increment applied on the fixed value
        driver.find_element(By.CSS_SELECTOR, 'dd a[href^="/record?key="]').click()

        def applied() -> bool:
            driver.refresh()
            return _fields(driver) == {"visits": "2"}

        wait_until(applied, 60, "the increment applied", interval_s=0.5)
        _shoot(driver, shots, "web-view-record.png")
        # And on a phone's width no page needs sideways scrolling
        driver.set_window_size(PHONE_WIDTH, 844)
        for path in ("/deliveries", "/dead-letters", f"/dead-letters/{row_id}", "/records"):
            driver.get(f"{view.base}{path}")
            width = driver.execute_script("return document.documentElement.scrollWidth")
            assert width <= driver.execute_script("return window.innerWidth"), path


def _fields(driver: WebDriver) -> dict[str, str]:
    from selenium.webdriver.common.by import By

    cells = driver.find_elements(By.CSS_SELECTOR, "main table tbody tr")
    found = {}
    for row in cells:
        name, value = row.find_elements(By.TAG_NAME, "td")
        found[str(name.text)] = str(value.text)
    return found

"""The gate report in a real browser: headless Chromium at 1,400 px shows it without
sideways scrolling, and every image fits the window (issue 15: a 1,311 px plot and a
2,387 px knob line overflowed the page)."""

from __future__ import annotations

import shutil

import pytest

CHROMIUM, DRIVER = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                reason="needs chromium + chromedriver (apt-get install chromium chromium-driver)")
WIDTH = 1400


@pytest.fixture
def browser(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},1000"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def test_report_fits_1400px_without_horizontal_overflow(browser, report_html, tmp_path):
    browser.get(report_html.as_uri())
    scroll, inner = browser.execute_script(
        "return [document.documentElement.scrollWidth, window.innerWidth]")
    assert inner == WIDTH
    assert scroll <= inner, f"page is {scroll} px wide in a {inner} px window"
    boxes = browser.execute_script(
        "return [...document.images].map(i => [i.getBoundingClientRect().width, i.getBoundingClientRect().right])")
    assert len(boxes) >= 4 and all(0 < width and right <= inner for width, right in boxes)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(WIDTH, min(height + 150, 16000))
    assert browser.save_screenshot(str(tmp_path / "report.png"))

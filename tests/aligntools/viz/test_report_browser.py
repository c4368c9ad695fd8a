"""The gate report and a notebook in a real browser (headless Chromium).

At 1,400 and 900 px the report shows without sideways scrolling (issue 15: a 1,311 px plot and a
2,387 px knob line overflowed the page) and its figures are drawn at a legible scale. A notebook saved after running a call with
``progress=False`` opens in JupyterLab without "Error displaying widget: model not found" (a
progress bar saved as a widget) and without overflow.

Chromium and chromedriver are part of the setup (``make debs``: Debian's ``chromium`` and
``chromium-driver``); without them this test fails and says how to install them, so CI never
silently stops looking at the report.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import nbformat
import pytest
from nbclient import NotebookClient

CHROMIUM, DRIVER = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
WIDTHS = (1400, 900)
MIN_SCALE = 0.9
"""A figure may be shrunk to at most this share of its drawn size: 10 pt labels stay >= 9 px."""


@pytest.fixture
def browser(tmp_path):
    if not (CHROMIUM and DRIVER):
        pytest.fail("needs chromium + chromedriver: run `make debs` (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTHS[0]},1000"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _page_width(browser) -> tuple[int, int]:
    return tuple(browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]"))


@pytest.mark.parametrize("width", WIDTHS)
def test_report_fits_the_window_and_stays_legible(browser, report_html, tmp_path, width):
    browser.set_window_size(width, 1000)
    browser.get(report_html.as_uri())
    scroll, inner = _page_width(browser)
    assert inner == width and scroll <= inner, f"page is {scroll} px wide in a {inner} px window"
    scales = browser.execute_script(
        "return [...document.images].map(i => i.getBoundingClientRect().width / i.naturalWidth)")
    assert len(scales) >= 4 and min(scales) >= (MIN_SCALE if width < 1100 else 0.5), scales
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(width, min(height + 150, 16000))
    assert browser.save_screenshot(str(tmp_path / f"report-{width}.png"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def saved_notebook(tmp_path, moe):
    """A notebook run headless and saved, as an attendee's would be: a model loaded with
    ``progress=False`` (transformers draws a "Loading weights" widget bar otherwise), a table, a figure."""
    cells = ["%matplotlib inline\nfrom minirl.quiet import quiet\nimport transformers\n"
             f"with quiet(progress=False):\n    model = transformers.AutoModelForCausalLM.from_pretrained({str(moe)!r})\n"
             "type(model).__name__",
             "import pandas as pd\npd.DataFrame({'site': ['embed', 'logits'], 'rel_l2': [1e-3, 2e-2]})",
             "from matplotlib.figure import Figure\nfig = Figure(figsize=(8, 3))\nfig.subplots().plot([1, 2, 3])\nfig"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute(
        env={**os.environ, "MPLBACKEND": "module://matplotlib_inline.backend_inline"})
    path = tmp_path / "nb" / "saved.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    return path


@pytest.fixture
def jupyterlab(saved_notebook, browser):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}",
                             "--allow-root", "--ServerApp.token=", "--ServerApp.password=",
                             f"--ServerApp.root_dir={saved_notebook.parent}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("JupyterLab did not open its port within 60 s")
    yield f"http://127.0.0.1:{port}/lab/tree/{saved_notebook.name}"
    # The server and the kernel the page started share its session: killed together, at once (a
    # SIGTERM waited the full 20 s on the page's kernel, each run).
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_saved_notebook_renders_in_jupyterlab_without_broken_widgets(browser, jupyterlab, tmp_path):
    browser.set_window_size(WIDTHS[0], 900)
    browser.get(jupyterlab)
    deadline = time.monotonic() + 90
    text = ""
    while time.monotonic() < deadline:  # the notebook panel renders its outputs asynchronously
        text = browser.execute_script(
            "const p = document.querySelector('.jp-NotebookPanel'); return p ? p.innerText : ''")
        if "logits" in text and browser.execute_script("return document.querySelectorAll('.jp-OutputArea img').length"):
            break
        time.sleep(1)
    browser.save_screenshot(str(tmp_path / "jupyterlab.png"))
    assert "logits" in text, "the notebook's outputs never rendered in JupyterLab"
    assert browser.execute_script("return document.querySelectorAll('.jp-OutputArea img').length") == 1, \
        "the saved figure is not drawn as an image"
    assert "model not found" not in text and "Error displaying widget" not in text
    overflow = browser.execute_script(
        "return [...document.querySelectorAll('.jp-OutputArea-output')].filter(o => o.scrollWidth > o.clientWidth + 1).length")
    assert overflow == 0, f"{overflow} output(s) wider than the notebook column"

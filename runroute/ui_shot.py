"""A real headless Chromium on the sidecar's live page: open it, wait for its first data, read the
browser console, write a screenshot (the demo's ``ui.png``, the browser test).

Algorithm: selenium drives Debian's ``chromium`` through ``chromium-driver`` at fixed paths
(:data:`CHROMEDRIVER`, :data:`CHROMIUM`), so selenium never downloads a browser or a driver; the
page is opened at ``/ui`` (with ``#key=`` when a key is given: the fragment never reaches the
server), and the caller waits until ``#status`` carries ``data-generated-at`` (the first
``/ui/data`` answer rendered).

Knobs: ``window`` (width, height of the viewport), ``timeout_s`` (the wait for the first data).
:func:`unavailable` says why no browser can run here (selenium or chromium missing), so a caller
that can do without (the demo) prints the reason and goes on.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["CHROMEDRIVER", "CHROMIUM", "unavailable", "browser", "open_ui", "screenshot_ui"]

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"


def unavailable() -> str | None:
    """None when a headless Chromium can run here, else the reason it cannot."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install 'runroute[dev]')"
    for path, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).exists() and shutil.which(Path(path).name) is None:
            return f"{path} not found (apt-get install {pkg})"
    return None


@contextlib.contextmanager
def browser(window: tuple[int, int] = (1400, 1500)) -> Iterator[Any]:
    """A headless Chromium webdriver with the browser console log kept; quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    binary = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if binary:
        opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.add_argument(f"--window-size={window[0]},{window[1]}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver_path = CHROMEDRIVER if Path(CHROMEDRIVER).exists() else shutil.which("chromedriver")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def open_ui(driver: Any, base_url: str, key: str | None = None, timeout_s: float = 20.0) -> None:
    """Open ``/ui`` and wait until its first ``/ui/data`` answer is rendered."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(base_url + "/ui" + (f"#key={key}" if key else ""))
    WebDriverWait(driver, timeout_s).until(
        lambda d: d.find_element(By.ID, "status").get_attribute("data-generated-at")
    )


def screenshot_ui(base_url: str, out: Path, key: str | None = None, timeout_s: float = 20.0) -> Path:
    """Open the live page in a headless Chromium and write a PNG screenshot to ``out``."""
    with browser() as driver:
        open_ui(driver, base_url, key, timeout_s)
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    return out

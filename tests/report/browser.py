"""Headless Chromium for report tests: the DOM and console of a page, by the CLI or by selenium + chromedriver.

Chromium comes from Debian (`apt-get install chromium chromium-driver`, done by .ci/run); tests skip with the reason
when it is missing. The flags keep Chromium off the network and away from the user's profile.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]
CONSOLE_RE = re.compile(r":(?:INFO|WARNING|ERROR|FATAL):CONSOLE[^\]]*\] (.*)")


def have_chromium() -> bool:
    return Path(CHROMIUM).exists()


def dump_dom(url: str, profile: Path, timeout_s: float = 60.0) -> tuple[str, list[str]]:
    """(serialized DOM after load, console messages) of a page, via `chromium --dump-dom`.

    Chromium's stderr log gives console messages without their level, so callers treat any message as a problem
    on a page that has no scripts of its own.
    """
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--dump-dom", url]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise RuntimeError(f"chromium exited with {p.returncode}: {p.stderr[-2000:]}")
    return p.stdout, [m.group(1) for m in CONSOLE_RE.finditer(p.stderr)]


def screenshot(url: str, out: Path, profile: Path, size: str = "1280,3000", timeout_s: float = 60.0) -> Path:
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={out}", f"--window-size={size}", url]
    subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=True)
    return out


def selenium_inspect(url: str, profile: Path) -> dict:
    """Load the page in Chromium through chromedriver; returns the browser log (with levels), each image's
    natural width (0 = not decoded), and the number of tables."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for f in FLAGS:
        opts.add_argument(f.replace("--headless", "--headless=new"))
    opts.add_argument(f"--user-data-dir={profile}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        driver.set_page_load_timeout(60)
        driver.get(url)
        images = driver.execute_script(
            "return Array.from(document.images).map(i => [i.alt, i.complete ? i.naturalWidth : 0]);")
        tables = driver.execute_script("return document.querySelectorAll('table').length;")
        log = driver.get_log("browser")
    finally:
        driver.quit()
    return {"images": images, "tables": tables, "log": log}

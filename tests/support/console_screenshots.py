"""The console's screenshots in docs/img/, from a real run: `make console-screenshots`.

Runs the logistics demo (300 customers, with its injected faults) into a temporary SQLite file,
serves the console over it and photographs its main pages in headless Chromium, logged in as an
operator. Nothing here is asserted; tests/test_console_browser.py is the test.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from selenium.webdriver.common.by import By

from oncebox import Box
from oncebox.console import ConsoleSettings
from oncebox.console.users import hash_password, parse_users
from oncebox.store.params import JobFilter
from support.console_browser import browser, served
from support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "docs" / "img"
PASSWORD = "screenshots only"


def main() -> int:
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'demo.db'}"
        subprocess.run(
            [sys.executable, "-m", "oncebox.cli", "demo", "--db", url],
            check=True,
            cwd=folder,
            capture_output=True,
        )
        box = Box(url)
        [dead] = box.store.job_list(JobFilter(state="dead", limit=1))
        done = box.store.job_list(JobFilter(state="done", limit=1))[0]
        users = parse_users(f"olga operator {hash_password(PASSWORD)}", "screenshots")
        with (
            served(box, ConsoleSettings(users=users)) as (base, _app),
            browser(1280, 900) as driver,
        ):
            driver.get(f"{base}/login")
            driver.find_element(By.NAME, "name").send_keys("olga")
            driver.find_element(By.NAME, "password").send_keys(PASSWORD)
            driver.find_element(By.CSS_SELECTOR, "form.login button").click()
            wait_until(lambda: driver.current_url == f"{base}/", what="the overview")
            pages = {
                "console-overview.png": "/",
                "console-periods.png": "/periods",
                "console-key.png": f"/keys/{done.key}",
                "console-dead-letters.png": "/dead",
                "console-dead-key.png": f"/keys/{dead.key}",
            }
            for name, path in pages.items():
                driver.get(f"{base}{path}")
                driver.save_screenshot(str(IMAGES / name))
                print(f"docs/img/{name}: {path}")
        box.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

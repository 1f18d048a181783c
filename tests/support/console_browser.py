"""The console served for real (uvicorn on a free port, in a thread) and a real headless Chromium
driving it (Debian's chromium and chromedriver, through Selenium; nothing downloaded)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from starlette.applications import Starlette

from oncebox import Box
from oncebox.console import ConsoleSettings, create_app
from oncebox.kernel.public_url import for_server
from support.binaries import require
from support.waiting import wait_until


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def served(
    box: Box, settings: ConsoleSettings, *, checked: bool = False
) -> Iterator[tuple[str, Starlette]]:
    """The console over `box`, served until the block ends: its base URL and its app;
    `checked`: knowing its public URL (the bind address), as `oncebox console` serves it."""
    port = free_port()
    if checked:
        settings = replace(settings, public_url=for_server(None, "127.0.0.1", port, ""))
    app = create_app(box, settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="console", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, what="the console to listen", timeout=30)
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(30)


@contextmanager
def browser(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """Headless Chromium from Debian's packages (skipped loudly outside CI when missing)."""
    chromium = require("chromium", "chromium")
    driver_path = require("chromedriver", "chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP violations land there
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def csp_violations(driver: Any) -> list[str]:
    """What the page's Content-Security-Policy refused so far (Chromium logs each refusal)."""
    return [
        entry["message"]
        for entry in driver.get_log("browser")
        if "Content Security Policy" in entry["message"]
    ]

"""The login link of a console without users, opened in a real headless Chromium: the page's
script posts the token from after `#` under the strict CSP, and the same link opened again is
refused. Skipped loudly outside CI when Debian's chromium or chromedriver cannot be installed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By

from oncebox import Box
from oncebox.console import ConsoleSettings
from oncebox.console.login_token import login_link
from support.console_browser import browser, csp_violations, served
from support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def box(tmp_path) -> Iterator[Box]:
    made = Box(f"sqlite:///{tmp_path / 'console.db'}")
    yield made
    made.close()


def test_the_printed_link_logs_in_by_itself_once_and_leaves_no_token_behind(box):
    with served(box, ConsoleSettings(), checked=True) as (base, app), browser() as driver:
        token = app.state.login_token.renew()
        driver.get(login_link(base, token))
        wait_until(lambda: driver.current_url == f"{base}/", what="the overview after the link")
        assert driver.find_element(By.CSS_SELECTOR, "form.logout")  # logged in
        assert csp_violations(driver) == []

        driver.delete_all_cookies()  # another browser, with the same link
        driver.get(login_link(base, token))
        wait_until(
            lambda: "works once" in driver.find_element(By.TAG_NAME, "main").text,
            what="the link refused the second time",
        )
        driver.get(f"{base}/jobs")
        assert driver.current_url == f"{base}/login"  # not logged in
        assert csp_violations(driver) == []


def test_without_script_the_token_is_pasted_into_the_form(box):
    with served(box, ConsoleSettings(), checked=True) as (base, app), browser() as driver:
        token = app.state.login_token.renew()
        driver.get(f"{base}/login")
        form = driver.find_element(By.ID, "token-login")
        form.find_element(By.NAME, "token").send_keys(token)
        form.find_element(By.TAG_NAME, "button").click()
        wait_until(lambda: driver.current_url == f"{base}/", what="the overview after pasting")

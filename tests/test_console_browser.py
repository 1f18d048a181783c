"""The console end to end in a real headless Chromium: log in, read the overview against the store
(its tiles and its week's figures refreshed together), open a key's receipt chain, dry-run and
confirm a replay of a dead message and see it delivered, resolve a held send (choosing what
happened: the form chooses nothing in advance).
Skipped loudly outside CI when Debian's chromium or chromedriver cannot be installed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from oncebox import Box, JobContext, Retry, ScheduleContext
from oncebox.console import ConsoleSettings
from oncebox.console.users import hash_password, parse_users
from oncebox.jobs.periods import iso_week
from oncebox.providers import Outgoing, Receipt
from oncebox.providers.base import SendAmbiguous, SendPermanent
from oncebox.status import status_data
from oncebox.store.params import AuditFilter
from support.console_browser import browser, csp_violations, served
from support.waiting import wait_until

pytestmark = pytest.mark.slow
PASSWORD = "a long operator password"
WEEK = "2026-W33"


class Provider:
    """Refuses customer 2's digest until `refusing` is emptied; loses the answer for 3's."""

    name = "scripted"
    idempotent = False
    idempotency_window: timedelta | None = None

    def __init__(self) -> None:
        self.refusing = {"c2@freight.example"}

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        to = outgoing.payload["to"][0]
        if to in self.refusing:
            raise SendPermanent("550 mailbox unavailable")
        if to.startswith("c3@"):
            raise SendAmbiguous("connection lost after DATA")
        return Receipt(f"r-{to}")


@pytest.fixture
def world(tmp_path) -> Iterator[tuple[Box, Provider, list[int]]]:
    """A week's digests fanned out to customers 1-4 (more join the list later)."""
    provider = Provider()
    box = Box(f"sqlite:///{tmp_path / 'console.db'}", secret="console-test-secret-0123456789")
    box.channel("email", provider=provider)
    eligible = [1, 2, 3, 4]

    @box.task(key="weekly-digest/customer-{customer}/{period}", retry=Retry(max_attempts=1))
    def digest(ctx: JobContext, customer: int, period: str) -> None:
        ctx.outbox.email(to=f"c{customer}@freight.example", subject="Your week", text="Hello")

    @box.schedule("weekly-digest", cron="0 9 * * MON", period=iso_week, task=digest)
    def customers(ctx: ScheduleContext) -> Any:
        for customer in eligible:
            yield {"customer": customer, "period": ctx.period}

    box.run_schedule("weekly-digest", WEEK)
    box.work(until_idle=True)
    yield box, provider, eligible
    box.close()


def figures(driver) -> dict[str, int]:
    """The overview's figures; {} while htmx is swapping them (retried by the caller)."""
    try:
        return {
            e.get_attribute("data-figure"): int(e.text)
            for e in driver.find_elements(By.CSS_SELECTOR, "[data-figure]")
        }
    except StaleElementReferenceException:
        return {}


def period_figures(driver) -> dict[str, int]:
    """The overview's figures of the week; {} while htmx is swapping them."""
    try:
        return {
            e.get_attribute("data-period-figure"): int(e.text)
            for e in driver.find_elements(By.CSS_SELECTOR, "[data-period-figure]")
        }
    except StaleElementReferenceException:
        return {}


def submit(driver, form_css: str, **fields: str) -> None:
    form = driver.find_element(By.CSS_SELECTOR, form_css)
    for name, value in fields.items():
        element = form.find_element(By.NAME, name)
        if element.get_attribute("type") == "radio":
            form.find_element(By.CSS_SELECTOR, f'input[name="{name}"][value="{value}"]').click()
        elif element.tag_name == "select":
            element.find_element(By.CSS_SELECTOR, f'option[value="{value}"]').click()
        else:
            element.clear()
            element.send_keys(value)
    buttons = form.find_elements(By.TAG_NAME, "button")
    if buttons:
        buttons[0].click()
    else:  # a search box: Enter submits it
        form.find_element(By.TAG_NAME, "input").send_keys(Keys.ENTER)


def test_an_operator_logs_in_reads_the_week_replays_a_dead_letter_and_resolves_a_held_send(world):
    box, provider, eligible = world
    users = parse_users(f"olga operator {hash_password(PASSWORD)}", "test")
    with served(box, ConsoleSettings(users=users)) as (base, app), browser() as driver:
        driver.get(f"{base}/")
        assert driver.current_url == f"{base}/login"  # nothing without a login
        submit(driver, "form.login", name="olga", password=PASSWORD)
        wait_until(lambda: driver.current_url == f"{base}/", what="the overview after login")

        status = status_data(box, periods=1)
        assert figures(driver) == {
            "ready": status["jobs"]["ready"],
            "leased": status["jobs"]["leased"],
            "pending": status["outbox"]["pending"],
            "held": status["ambiguous"],
            "dead": status["dead"],
            "workers": status["workers_live"],
        }
        assert (status["dead"], status["ambiguous"]) == (1, 1)
        assert period_figures(driver) == {"sent": 2, "pending": 0, "dead": 1, "held": 1}

        # the chart draws from the console's samples, the tiles and the week's figures refresh
        # in place together (htmx), and the strict CSP refuses nothing the console itself serves
        app.state.trends.sample()
        driver.refresh()
        wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "#trend canvas"), what="the chart")
        eligible.append(5)
        box.run_schedule("weekly-digest", WEEK)  # customer 5's job: ready, and the week's
        driver.execute_script("htmx.trigger('#figures', 'refresh')")
        wait_until(
            lambda: (figures(driver).get("ready"), period_figures(driver).get("pending")) == (1, 1),
            what="the tiles and the week's figures to refresh together",
        )
        assert "no job or message has moved since" in driver.find_element(By.ID, "schedules").text
        assert csp_violations(driver) == []
        box.work(until_idle=True)

        # a key's receipt chain, found from the search box
        key = f"weekly-digest/customer-2/{WEEK}"
        submit(driver, "form.search", key=key)
        wait_until(lambda: f"/keys/{key}" in driver.current_url, what="key page")
        page = driver.find_element(By.TAG_NAME, "main").text
        assert "Claimed by job" in page and "550 mailbox unavailable" in page

        # the provider takes it now: a dry run of the dead messages, confirmed, replays the
        # message in place (same key), and the worker delivers it
        provider.refusing.clear()
        driver.get(f"{base}/dead?kind=delivery")
        driver.find_element(By.LINK_TEXT, "dry run: replay").click()
        wait_until(lambda: "Dry run: replay" in driver.title, what="the dry run")
        assert figures(driver) == {"planned": 1}
        assert key in driver.find_element(By.TAG_NAME, "table").text
        submit(driver, "form.act", reason="mailbox fixed (ticket 42)")
        wait_until(lambda: "Finished." in driver.page_source, what="the batch to finish")
        assert figures(driver) == {"done": 1, "skipped": 0, "left": 0}
        box.work(until_idle=True)
        driver.get(f"{base}/keys/{key}")
        [message] = box.store.outbox_find_by_key(key)
        assert message.state == "sent" and message.receipt == "r-c2@freight.example"
        assert "r-c2@freight.example" in driver.find_element(By.TAG_NAME, "main").text

        # the held send: the form chooses nothing in advance, so sending it as it comes is
        # refused by the browser; resolved as sent, with the provider's receipt
        held_key = f"weekly-digest/customer-3/{WEEK}"
        driver.get(f"{base}/held")
        form = driver.find_element(By.CSS_SELECTOR, "form.act")
        choices = form.find_elements(By.NAME, "resolution")
        assert [c.is_selected() for c in choices] == [False, False]
        submit(driver, "form.act", reason="provider log")
        assert driver.execute_script("return arguments[0].checkValidity()", form) is False
        assert choices[0].get_attribute("validationMessage")  # what the browser says
        assert box.store.outbox_find_by_key(held_key)[0].state == "ambiguous"
        submit(driver, "form.act", resolution="sent", receipt="prov-7", reason="provider log")
        wait_until(lambda: "recorded as sent" in driver.page_source, what="the resolve notice")
        [held] = box.store.outbox_find_by_key(held_key)
        assert (held.state, held.receipt) == ("sent", "prov-7")
        actors = {a.actor for a in box.store.audit_search(AuditFilter(limit=10))}
        assert actors == {"olga"}
        assert csp_violations(driver) == []

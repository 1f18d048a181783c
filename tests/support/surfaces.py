"""One box behind every input surface — the console, the HTTP API and the delivery receiver —
holding one of each row those surfaces act on (a done key with its sent message, a dead job, a
dead message, a held send, a schedule's period, audit entries), so requests reach the handlers'
store statements, not only their "not found" branches; and clients for each surface, signed in.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from conftest import database_from
from oncebox import Box, JobContext, Reports, Retry, ScheduleContext
from oncebox.api import ApiSettings, create_api
from oncebox.api.deliveries import create_receiver
from oncebox.api.keys import issue_key
from oncebox.console import ConsoleSettings, create_app
from oncebox.console.users import parse_users
from oncebox.jobs.dead_letters import DeadFilter
from oncebox.jobs.periods import iso_week
from oncebox.providers import Outgoing, Receipt
from oncebox.providers.base import SendAmbiguous, SendPermanent
from support.reports import SECRET, SECRET_ENV
from support.seeded_work import work_seeded

CONSOLE = "http://console.test"
PERIOD = "2026-W33"
# a user file's line needs a well-formed hash; nobody logs in with it (sessions are minted)
OPERATOR_HASH = "scrypt$16384$8$1$c2FsdHNhbHRzYWx0c2FsdA$" + "A" * 43
USERS = parse_users(f"olga operator {OPERATOR_HASH}", "surface users")


class Scripted:
    """Refuses customer 2's message for good and loses the answer for customer 3's; sends the
    rest."""

    name = "scripted"
    idempotent = False
    idempotency_window: timedelta | None = None

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        to = outgoing.payload["to"][0]
        if to.startswith("c2@"):
            raise SendPermanent("550 mailbox refused")
        if to.startswith("c3@"):
            raise SendAmbiguous("timeout after DATA")
        return Receipt(f"r-{to}")


def seeded_box(url: str) -> Box:
    """The box (its channel `email` takes provider reports: set SECRET_ENV first) with its rows:
    customers 1-4 of PERIOD fanned out and worked — 1 sent, 2 a dead message, 3 held, 4 a dead
    job — and one replay audited; nothing of any other week, on any day."""
    box = Box(url, seed=11, secret="surfaces-test-secret-0123456789")
    box.channel("email", provider=Scripted(), reports=Reports(secret_env=SECRET_ENV))

    @box.task(key="weekly-digest/customer-{customer_id}/{period}", retry=Retry(max_attempts=1))
    def weekly_digest(ctx: JobContext, customer_id: int, period: str) -> None:
        if customer_id == 4:
            raise ValueError("no shipments")
        ctx.outbox.email(to=f"c{customer_id}@freight.example", subject="Week", text="Hello")

    @box.schedule("weekly-digest", cron="0 9 * * MON", period=iso_week, task="weekly_digest")
    def customers(ctx: ScheduleContext) -> Any:
        for customer_id in (1, 2, 3, 4):
            yield {"customer_id": customer_id, "period": ctx.period}

    box.run_schedule("weekly-digest", PERIOD)
    work_seeded(box)  # PERIOD's rows only, whatever week is due on the real clock
    [job] = box.dead_letters(DeadFilter(kind="job"))
    box.replay(job.id, reason="seeded", actor="seed", kind="job")
    work_seeded(box)  # dead again: a dead job with two attempts and an audit entry
    return box


@dataclass
class Surfaces:
    box: Box
    console: Any
    api: Any
    receiver: Any
    token: str  # an API key with every scope
    url: str = ""  # the database's


def surfaces(box: Box) -> Surfaces:
    """The three apps over `box` (its reports' secret read now, from SECRET_ENV)."""
    token = issue_key(
        box.store, "every-scope", ["enqueue", "read", "operate"], rate="100000/s", by="test"
    ).token
    console = create_app(box, ConsoleSettings(users=USERS))
    return Surfaces(box, console, create_api(box, ApiSettings()), create_receiver(box), token)


@contextmanager
def seeded_surfaces(store: str, request: Any, folder: Path) -> Iterator[Surfaces]:
    """`seeded_box` on `store` ("sqlite", or "postgres": a database of its own, copied from the
    session's template — so a module's tests can share one), with its surfaces."""
    with ExitStack() as stack:
        if store == "sqlite":
            url = f"sqlite:///{folder / 'surfaces.db'}"
        else:
            url = stack.enter_context(database_from(request.getfixturevalue("pg_template")))
        box = seeded_box(url)
        stack.callback(box.close)
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(SECRET_ENV, SECRET)
            found = surfaces(box)
        found.url = url
        yield found


@contextmanager
def clients(found: Surfaces) -> Iterator[tuple[TestClient, TestClient, TestClient]]:
    """The console's, the API's and the receiver's test clients, their apps started; a server
    error is answered 500, as a server would, not raised into the test."""
    with (
        TestClient(
            found.console, base_url=CONSOLE, follow_redirects=False, raise_server_exceptions=False
        ) as console,
        TestClient(found.api, raise_server_exceptions=False) as api,
        TestClient(found.receiver, raise_server_exceptions=False) as receiver,
    ):
        yield console, api, receiver


def operator(console_app: Any, web: TestClient) -> str:
    """Sign `web` in as an operator (a session minted, no password hashed); its CSRF token."""
    session = console_app.state.sessions.start("olga", "operator")
    web.cookies.set("oncebox_session", session.id)
    csrf: str = session.csrf
    return csrf


def action_id() -> str:
    """A fresh one-time id for an action form."""
    return secrets.token_urlsafe(16)


def notices(web: TestClient, path: str = "/") -> list[str]:
    """The notices a console page shows (and so takes)."""
    page = web.get(path)
    return re.findall(r'<p class="notice [a-z]+">(.*?)</p>', page.text, re.S)

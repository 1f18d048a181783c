"""The operator console's routes, through Starlette's test client on a real store: deny by default
(no login, wrong role, no CSRF token, another origin), what its pages show against what the store
holds, hostile text rendered inert, and actions that act once and are audited with the user."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from oncebox import Box, Concurrency, JobContext, Retry, ScheduleContext, Slo
from oncebox.console import ConsoleSettings, create_app
from oncebox.console.users import hash_password, parse_users
from oncebox.jobs.periods import iso_week
from oncebox.providers import Outgoing, Receipt
from oncebox.providers.base import SendAmbiguous, SendPermanent
from oncebox.runtime.fanout import FanOut
from oncebox.status import status_data
from oncebox.store.params import AuditFilter, JobFilter, ProviderEvent
from oncebox.testing import FrozenClock
from support.digest_schedule import scheduled_box
from support.rows import job_row
from support.seeded_work import work_seeded
from support.waiting import wait_until

BASE = "http://console.test"
SAME = {"origin": BASE}
MONDAY_W33 = datetime(2026, 8, 10, 9, 0, tzinfo=UTC)
XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'
PASSWORDS = {"olga": "operator-password", "vic": "viewer-password"}


class ScriptedProvider:
    """Refuses the message of customer 2 for good, loses the answer for customer 3's, sends the
    rest; its replies carry hostile markup."""

    name = "scripted"
    idempotent = False
    idempotency_window: timedelta | None = None

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        to = outgoing.payload["to"][0]
        if to.startswith("c2@"):
            raise SendPermanent(f"550 mailbox refused {XSS}")
        if to.startswith("c3@"):
            raise SendAmbiguous(f"timeout after DATA {XSS}")
        return Receipt(f"r-{to}")


@pytest.fixture(scope="module")
def store_box(tmp_path_factory) -> Iterator[Box]:
    """A store holding one of everything the console shows: a done key with its sent message, a
    dead job whose arguments and error carry markup, a dead message, a held send, a job held
    back by a limit."""
    url = f"sqlite:///{tmp_path_factory.mktemp('console') / 'console.db'}"
    box = Box(url, secret="console-test-secret-0123456789")
    box.channel("email", provider=ScriptedProvider())

    @box.task(key="digest/customer-{customer}", retry=Retry(max_attempts=1))
    def digest(ctx: JobContext, customer: int, note: str) -> None:
        if customer == 4:
            raise ValueError(f"no shipments for {note}")
        ctx.outbox.email(to=f"c{customer}@freight.example", subject="Your week", text="Hello")

    @box.task(partition="{tenant}", limits=[Concurrency(2, per_partition=True)])
    def export(ctx: JobContext, tenant: str) -> None:
        pass

    for customer in (1, 2, 3, 4):
        box.enqueue(digest, customer=customer, note=XSS)
    box.work(until_idle=True)
    box.enqueue(export, tenant="acme")  # waits: no worker runs after this
    yield box
    box.close()


def users() -> dict[str, Any]:
    return parse_users(
        f"olga operator {hash_password(PASSWORDS['olga'])}\n"
        f"vic viewer {hash_password(PASSWORDS['vic'])}",
        "test users",
    )


USERS = users()


@pytest.fixture
def app(store_box: Box):
    return create_app(store_box, ConsoleSettings(users=USERS))


def client(app: Any, **kwargs: Any) -> TestClient:
    return TestClient(app, base_url=BASE, follow_redirects=False, **kwargs)


def login_form_token(web: TestClient) -> str:
    page = web.get("/login")
    found = re.search(r'name="login_csrf" value="([^"]+)"', page.text)
    assert found, page.text
    return found.group(1)


def logged_in(app: Any, name: str = "olga") -> TestClient:
    web = client(app)
    token = login_form_token(web)
    done = web.post(
        "/login",
        data={"name": name, "password": PASSWORDS[name], "login_csrf": token},
        headers={"origin": BASE},
    )
    assert done.status_code == 303, done.text
    return web


def form_fields(html: str, action: str) -> list[dict[str, str]]:
    """The hidden fields of each form posting to `action` on a page."""
    forms = re.findall(
        rf'<form method="post" action="[^"]*{re.escape(action)}"(.*?)</form>', html, re.S
    )
    return [
        {
            m.group(1): unescape(m.group(2))
            for m in re.finditer(r'type="hidden" name="(\w+)" value="([^"]*)"', f)
        }
        for f in forms
    ]


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF token on the page"
    return found.group(1)


def audit_count(box: Box, action: str) -> int:
    return len(box.store.audit_search(AuditFilter(action=action, limit=1000)))


PAGES = [
    "/",
    "/periods",
    "/jobs",
    "/outbox",
    "/keys",
    "/keys/digest/customer-1",
    "/dead",
    "/held",
    "/audit",
]


@pytest.mark.parametrize("path", PAGES)
def test_every_page_sends_a_visitor_without_a_session_to_the_login_form(app, path):
    response = client(app).get(path)
    assert response.status_code == 303
    assert response.headers["location"] == "/login"


@pytest.mark.parametrize("path", ["/dead/replay", "/dead/discard", "/held/resolve"])
def test_every_action_is_refused_without_a_session(app, path, store_box):
    before = len(store_box.store.audit_search(AuditFilter(limit=1000)))
    response = client(app).post(path, data={"id": "1", "reason": "r"}, headers={"origin": BASE})
    assert response.status_code == 401
    assert len(store_box.store.audit_search(AuditFilter(limit=1000))) == before


def test_a_wrong_password_is_refused_and_repeated_failures_stop_the_address_for_the_name(app):
    web = client(app)
    for _ in range(5):
        refused = web.post(
            "/login",
            data={"name": "olga", "password": "guess", "login_csrf": login_form_token(web)},
            headers={"origin": BASE},
        )
        assert refused.status_code == 401
        assert "oncebox_session" not in refused.cookies
    locked = web.post(
        "/login",
        data={"name": "olga", "password": PASSWORDS["olga"], "login_csrf": login_form_token(web)},
        headers={"origin": BASE},
    )
    assert locked.status_code == 429  # even the right password from there, until the window
    assert "Too many failed logins" in locked.text  # passes (test_console_login.py: elsewhere)


def test_a_login_from_another_origin_or_without_the_form_token_is_refused(app):
    web = client(app)
    token = login_form_token(web)
    data = {"name": "vic", "password": PASSWORDS["vic"], "login_csrf": token}
    assert (
        web.post("/login", data=data, headers={"origin": "https://evil.example"}).status_code == 403
    )
    assert (
        web.post(
            "/login", data={**data, "login_csrf": "forged"}, headers={"origin": BASE}
        ).status_code
        == 400
    )


def test_a_session_cookie_is_http_only_and_same_site_strict_and_logout_ends_it(app):
    web = client(app)
    done = web.post(
        "/login",
        data={"name": "vic", "password": PASSWORDS["vic"], "login_csrf": login_form_token(web)},
        headers={"origin": BASE},
    )
    cookie = done.headers["set-cookie"]
    assert "oncebox_session=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert "Secure" not in cookie  # plain http here; see the https test
    assert web.get("/").status_code == 200
    csrf = csrf_of(web.get("/").text)
    out = web.post("/logout", data={"csrf": csrf}, headers={"origin": BASE})
    assert out.status_code == 303
    assert web.get("/").status_code == 303  # the session is gone, whatever the browser keeps


def test_over_https_the_session_cookie_is_secure(store_box):
    web = TestClient(
        create_app(store_box, ConsoleSettings(users=USERS)),
        base_url="https://console.test",
        follow_redirects=False,
    )
    page = web.get("/login")
    found = re.search(r'name="login_csrf" value="([^"]+)"', page.text)
    assert found
    token = found.group(1)
    done = web.post(
        "/login",
        data={"name": "vic", "password": PASSWORDS["vic"], "login_csrf": token},
        headers={"origin": "https://console.test"},
    )
    assert "Secure" in done.headers["set-cookie"]


def test_without_users_only_the_token_printed_at_start_logs_in(store_box):
    app = create_app(store_box, ConsoleSettings())
    token = app.state.login_token.renew()
    web = client(app)
    nonce = login_form_token(web)
    wrong = web.post("/login", data={"token": "wrong", "login_csrf": nonce}, headers=SAME)
    assert wrong.status_code == 403
    assert web.get("/").status_code == 303
    nonce = login_form_token(web)
    done = web.post("/login", data={"token": token, "login_csrf": nonce}, headers=SAME)
    assert done.status_code == 303
    assert web.get("/").status_code == 200


def test_every_response_carries_a_strict_content_security_policy(app):
    web = logged_in(app)
    for path in ["/login", "/", "/static/console.css"]:
        headers = web.get(path).headers
        assert "script-src 'self'" in headers["content-security-policy"]
        assert "unsafe-inline" not in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"
        assert headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in web.get("/").text  # no inline script on any page


def test_the_overview_shows_the_figures_status_shows(app, store_box):
    page = logged_in(app, "vic").get("/").text
    status = status_data(store_box, periods=1)
    shown = dict(re.findall(r'data-figure="(\w+)">(\d+)<', page))
    assert shown == {
        "ready": str(status["jobs"]["ready"]),
        "leased": str(status["jobs"]["leased"]),
        "pending": str(status["outbox"]["pending"]),
        "held": str(status["ambiguous"]),
        "dead": str(status["dead"]),
        "workers": str(status["workers_live"]),
    }
    assert (shown["dead"], shown["held"]) == ("2", "1")  # customer 4's job, 2's message; 3's


def test_hostile_text_in_arguments_errors_and_provider_replies_is_shown_inert(app):
    web = logged_in(app, "vic")
    for path in [
        "/keys/digest/customer-2",
        "/keys/digest/customer-4",
        "/dead",
        "/held",
        "/jobs?state=dead",
    ]:
        page = web.get(path).text
        assert "<script>alert" not in page and "<img src=x" not in page, path
        assert "&lt;script&gt;" in page or "&lt;img" in page, path


def test_a_keys_page_shows_its_whole_receipt_chain(app, store_box):
    page = logged_in(app, "vic").get("/keys/digest/customer-1").text
    [message] = store_box.store.outbox_find_by_key("digest/customer-1")
    assert "Claimed by job" in page
    assert f"message {message.id}" in page and "r-c1@freight.example" in page  # the receipt
    assert "Your week" in page  # the frozen content


def test_an_invalid_key_is_named_and_never_put_into_a_link(app):
    page = logged_in(app, "vic").get("/keys", params={"key": 'x/"><script>'})
    assert page.status_code == 400
    assert "<script>" not in page.text and "ASCII letters" in page.text


def test_a_viewer_may_look_but_not_act(app, store_box):
    web = logged_in(app, "vic")
    page = web.get("/dead").text
    assert 'action="/dead/replay"' not in page  # no form is even offered
    csrf = csrf_of(page)
    [dead_job] = [j for j in store_box.store.job_find_by_key("digest/customer-4")]
    refused = web.post(
        "/dead/replay",
        data={
            "csrf": csrf,
            "action_id": "a" * 22,
            "id": str(dead_job.id),
            "kind": "job",
            "reason": "try",
        },
        headers={"origin": BASE},
    )
    assert refused.status_code == 403 and "viewer" in refused.text
    assert job_row(store_box, dead_job.id).state == "dead"


def test_an_action_without_the_csrf_token_or_from_another_origin_changes_nothing(app, store_box):
    web = logged_in(app)
    [fields] = [f for f in form_fields(web.get("/keys/digest/customer-4").text, "/dead/replay")]
    before = audit_count(store_box, "replay")
    data = {**fields, "reason": "try"}
    assert (
        web.post(
            "/dead/replay", data={**data, "csrf": "forged"}, headers={"origin": BASE}
        ).status_code
        == 403
    )
    assert (
        web.post("/dead/replay", data=data, headers={"origin": "https://evil.example"}).status_code
        == 403
    )
    assert web.post("/dead/replay", data=data).status_code == 403  # no Origin, no Referer
    assert audit_count(store_box, "replay") == before
    assert job_row(store_box, int(fields["id"])).state == "dead"


def test_a_double_submitted_replay_replays_once_and_audits_once_as_the_user(tmp_path):
    box = Box(f"sqlite:///{tmp_path / 'twice.db'}")

    @box.task(key="t/{n}", retry=Retry(max_attempts=1))
    def fails(ctx: JobContext, n: int) -> None:
        raise ValueError("down")

    job_id = box.enqueue(fails, n=1).job_id
    box.work(until_idle=True)
    web = logged_in(create_app(box, ConsoleSettings(users=USERS)))
    [fields] = form_fields(web.get("/keys/t/1").text, "/dead/replay")
    data = {**fields, "reason": "the API is back"}
    first = web.post("/dead/replay", data=data, headers={"origin": BASE})
    second = web.post("/dead/replay", data=data, headers={"origin": BASE})
    assert first.status_code == second.status_code == 303
    assert second.headers["location"] == first.headers["location"]
    [entry] = box.store.audit_search(AuditFilter(action="replay", limit=10))
    assert (entry.actor, entry.reason, entry.target_id) == ("olga", "the API is back", job_id)
    assert job_row(box, job_id).state == "ready"
    shown = web.get(first.headers["location"]).text
    assert "already taken" in shown or "Replayed job" in shown
    box.close()


def test_resolving_a_held_send_records_it_as_sent_by_the_user(tmp_path):
    box = Box(f"sqlite:///{tmp_path / 'held.db'}", secret="console-test-secret-0123456789")
    box.channel("email", provider=ScriptedProvider())

    @box.task(key="digest/customer-{customer}")
    def digest(ctx: JobContext, customer: int) -> None:
        ctx.outbox.email(to=f"c{customer}@freight.example", subject="Your week", text="Hello")

    box.enqueue(digest, customer=3)
    box.work(until_idle=True)
    [held] = box.store.outbox_find_by_key("digest/customer-3")
    assert held.state == "ambiguous"
    web = logged_in(create_app(box, ConsoleSettings(users=USERS)))
    [fields] = form_fields(web.get("/held").text, "/held/resolve")
    done = web.post(
        "/held/resolve",
        data={
            **fields,
            "resolution": "sent",
            "receipt": "prov-42",
            "reason": "provider log shows it",
        },
        headers={"origin": BASE},
    )
    assert done.status_code == 303
    row = box.store.outbox_get(held.id)
    assert row is not None
    assert (row.state, row.receipt) == ("sent", "prov-42")
    [entry] = box.store.audit_search(AuditFilter(action="resolve-sent", limit=10))
    assert entry.actor == "olga"
    box.close()


def test_under_a_path_prefix_every_link_and_cookie_carries_it(store_box):
    app = create_app(store_box, ConsoleSettings(users=USERS))
    web = TestClient(app, base_url=BASE, root_path="/ops", follow_redirects=False)
    assert web.get("/").headers["location"] == "/ops/login"
    page = web.get("/login")
    assert 'href="/ops/static/console.css"' in page.text
    assert "Path=/ops;" in page.headers["set-cookie"]


def test_every_page_renders_the_same_rows_on_both_stores(box):
    box.channel("email", provider=ScriptedProvider())

    @box.task(key="digest/customer-{customer}", retry=Retry(max_attempts=1))
    def digest(ctx: JobContext, customer: int, note: str) -> None:
        if customer == 4:
            raise ValueError("no shipments")
        ctx.outbox.email(to=f"c{customer}@freight.example", subject="Your week", text="Hello")

    for customer in (1, 2, 3, 4):
        box.enqueue(digest, customer=customer, note="n")
    box.work(until_idle=True)
    web = logged_in(create_app(box, ConsoleSettings(users=USERS)), "vic")
    for path in PAGES:
        assert web.get(path).status_code == 200, path
    assert "c2@freight.example" in web.get("/keys/digest/customer-2").text
    dead = web.get("/dead").text
    assert "digest/customer-4" in dead and "digest/customer-2" in dead
    assert "digest/customer-3" in web.get("/held").text
    assert "digest/customer-1" not in dead


def dead_world(tmp_path) -> Box:
    box = Box(f"sqlite:///{tmp_path / 'batch.db'}")

    @box.task(key="t/{n}", retry=Retry(max_attempts=1))
    def fails(ctx: JobContext, n: int) -> None:
        raise ValueError(f"down {n}")

    for n in range(1, 5):
        box.enqueue(fails, n=n)
    box.work(until_idle=True)
    return box


def states(box: Box) -> dict[str | None, str]:
    return {j.key: j.state for n in range(1, 5) for j in box.store.job_find_by_key(f"t/{n}")}


def test_a_dry_run_lists_what_would_move_and_changes_nothing(tmp_path):
    box = dead_world(tmp_path)
    web = logged_in(create_app(box, ConsoleSettings(users=USERS)))
    page = web.get("/dead/plan", params={"do": "replay", "error": "down", "newer_than": "1d"})
    assert page.status_code == 200
    assert 'data-figure="planned">4<' in page.text
    assert all(f"t/{n}" in page.text for n in range(1, 5))
    assert set(states(box).values()) == {"dead"}
    assert box.store.audit_search(AuditFilter(limit=10)) == []
    box.close()


def test_a_confirmed_batch_replays_exactly_its_plan_and_shows_what_it_skipped(tmp_path):
    box = dead_world(tmp_path)
    app = create_app(box, ConsoleSettings(users=USERS))
    web = logged_in(app)
    page = web.get("/dead/plan", params={"do": "replay", "task": "fails"}).text
    [fields] = form_fields(page, "/dead/batch")
    box.replay("t/2", reason="someone else, meanwhile", actor="vic")  # after the dry run
    box.enqueue("fails", n=5)  # a new one: never planned, never touched
    box.work(until_idle=True)  # t/2 fails and dies again; t/5 dies
    done = web.post(
        "/dead/batch", data={**fields, "reason": "API key rotated"}, headers={"origin": BASE}
    )
    assert done.status_code == 303
    batch_id = done.headers["location"].rsplit("/", 1)[1]
    batch = wait_until(
        lambda: (b := app.state.batches.get(batch_id)) and b.finished and b,
        what="the batch to finish",
    )
    assert sorted(o.key for o in batch.done) == ["t/1", "t/3", "t/4"]
    assert [s.letter.key for s in batch.skipped] == ["t/2"]  # dead again: not replayed twice
    assert states(box) == {"t/1": "ready", "t/2": "dead", "t/3": "ready", "t/4": "ready"}
    [t5] = box.store.job_find_by_key("t/5")
    assert t5.state == "dead"
    shown = web.get(done.headers["location"]).text
    assert "t/2" in shown and "Finished" in shown
    replays = box.store.audit_search(AuditFilter(action="replay", limit=10))
    assert sorted(a.actor for a in replays) == ["olga", "olga", "olga", "vic"]
    again = web.post(
        "/dead/batch",
        data={**fields, "action_id": "b" * 22, "reason": "twice"},
        headers={"origin": BASE},
    )
    assert "no longer kept" in web.get(again.headers["location"]).text  # a plan runs once
    assert len(box.store.audit_search(AuditFilter(action="replay", limit=10))) == 4
    box.close()


def test_a_viewer_sees_a_dry_run_but_cannot_confirm_one(tmp_path):
    box = dead_world(tmp_path)
    web = logged_in(create_app(box, ConsoleSettings(users=USERS)), "vic")
    page = web.get("/dead/plan", params={"do": "discard"}).text
    assert 'data-figure="planned">4<' in page and "/dead/batch" not in page
    refused = web.post(
        "/dead/batch",
        data={"csrf": csrf_of(page), "action_id": "c" * 22, "plan": "x", "reason": "r"},
        headers={"origin": BASE},
    )
    assert refused.status_code == 403
    assert set(states(box).values()) == {"dead"}
    box.close()


def test_a_filter_mistake_is_named_on_the_page(tmp_path):
    box = dead_world(tmp_path)
    web = logged_in(create_app(box, ConsoleSettings(users=USERS)), "vic")
    page = web.get("/dead/plan", params={"do": "replay", "older_than": "soon"})
    assert page.status_code == 400 and "is not a duration" in page.text
    assert "cannot go with" in web.get("/dead", params={"kind": "job", "channel": "email"}).text
    box.close()


def test_discarding_a_dead_job_from_its_page_frees_its_key_audited_as_the_user(tmp_path):
    box = dead_world(tmp_path)
    web = logged_in(create_app(box, ConsoleSettings(users=USERS)))
    [fields] = form_fields(web.get("/keys/t/1").text, "/dead/discard")
    done = web.post(
        "/dead/discard", data={**fields, "reason": "customer left"}, headers={"origin": BASE}
    )
    assert "Discarded job" in web.get(done.headers["location"]).text
    assert job_row(box, int(fields["id"])).state == "cancelled"
    assert box.enqueue("fails", n=1).job_id is not None  # the key is free again
    [entry] = box.store.audit_search(AuditFilter(action="discard", limit=10))
    assert (entry.actor, entry.reason) == ("olga", "customer left")
    box.close()


def test_the_lists_filter_by_key_prefix(app):
    web = logged_in(app, "vic")
    jobs = web.get("/jobs", params={"key_prefix": "digest/customer-4"}).text
    assert "digest/customer-4" in jobs and "digest/customer-1" not in jobs
    messages = web.get("/outbox", params={"key_prefix": "digest/customer-2"}).text
    assert "digest/customer-2" in messages and "digest/customer-3" not in messages


@pytest.mark.slow
def test_a_periods_page_names_its_undelivered_subjects_and_why(tmp_path):
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    ran = subprocess.run(
        [sys.executable, "-m", "oncebox.cli", "demo", "--db", url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    box = Box(url)
    [dead] = box.store.job_list(JobFilter(state="dead", limit=5))
    web = logged_in(create_app(box, ConsoleSettings(users=USERS)), "vic")
    periods = web.get("/periods").text
    link = f"/periods/{dead.schedule}/{dead.period}"
    assert f'href="{link}"' in periods
    page = web.get(link).text
    assert dead.key is not None and dead.key in page
    assert "is not an address" in page  # why: the poison customer's broken address
    assert page.count('class="state dead"') == 1  # the only subject not delivered
    # the demo's promise, and the week judged by it in the SLO columns: the poison its one miss
    assert "SLO: 97.00 % delivered within 4h" in periods
    overview = web.get("/").text
    [(sli, misses)] = re.findall(
        r"<td>(\d+\.\d\d) %</td>\s*<td class=\"\">(1 / \d+)</td>", overview
    )
    # 97 % of the week's ~270 eligible customers on time allows 8 misses; the poison is the one
    assert float(sli) > 99 and misses == "1 / 8", (sli, misses)
    box.close()


def sent_digest(path: Path) -> Box:
    """A box on its own database whose digest to customer 1 was sent."""
    box = Box(f"sqlite:///{path}", secret="console-test-secret-0123456789")
    box.channel("email", provider=ScriptedProvider())

    @box.task(key="digest/customer-{customer}")
    def digest(ctx: JobContext, customer: int) -> None:
        ctx.outbox.email(to=f"c{customer}@freight.example", subject="Your week", text="Hello")

    box.enqueue(digest, customer=1)
    box.work(until_idle=True)
    return box


def test_a_key_page_says_what_retention_dropped_and_shows_none_of_it(tmp_path):
    """After the pruner drops a sent message's content and its attempts, the key's page says so
    (with the receipt still there) instead of showing an empty payload or "no send attempted"."""
    box = sent_digest(tmp_path / "kept.db")
    try:
        before = logged_in(create_app(box, ConsoleSettings(users=USERS))).get(
            "/keys/digest/customer-1"
        )
        assert "Your week" in before.text and "frozen content" in before.text
        assert box.store.prune("payloads", "email", timedelta(0), 10) == 1
        assert box.store.prune("delivery_attempts", "", timedelta(0), 10) == 1
        page = logged_in(create_app(box, ConsoleSettings(users=USERS))).get(
            "/keys/digest/customer-1"
        )
        assert page.status_code == 200
        assert "Your week" not in page.text and "frozen content" not in page.text
        assert "content dropped by retention" in page.text
        assert "attempts pruned by retention" in page.text
        assert "receipt r-c1@freight.example" in page.text  # kept
    finally:
        box.close()


def test_the_overview_shows_what_retention_keeps(app, store_box):
    page = logged_in(app, "vic").get("/").text
    rows = re.findall(
        r"<tr><td>([a-z ]+)</td><td>([^<]*)</td><td>([^<]+)</td>\s*<td>[^<]*</td>"
        r'<td class="[a-z]*">(\d+\+?)</td></tr>',
        page,
    )
    shown = {(kind, name): (kept, waiting) for kind, name, kept, waiting in rows}
    assert shown[("message payloads", "email")] == ("7d", "0")
    assert shown[("finished jobs", "digest")] == ("14d", "0")
    assert shown[("intents", "digest")] == ("for ever", "0")
    entries = status_data(store_box, periods=1)["retention"]
    assert len(shown) == len(entries)


def test_the_overview_shows_what_each_limit_holds_back(app, store_box):
    page = logged_in(app, "vic").get("/").text
    assert "<h2>Limits" in page
    rows = re.findall(
        r"<tr><td>([^<]+)</td><td>([^<]+)</td><td>([^<]+)</td>\s*<td>(\d+)</td><td>(\d+)</td>",
        page,
    )
    assert ("export:concurrency/partition", "all", "2 at once per partition", "0", "1") in rows
    partitions = [r[1] for r in rows if r[0] == "export:concurrency/partition"]
    assert partitions == ["all", "acme"]


def test_a_key_page_says_what_the_provider_reported(tmp_path):
    box = sent_digest(tmp_path / "reported.db")
    try:
        [message] = box.store.outbox_find_by_key("digest/customer-1")
        event = ProviderEvent(
            "email", "msg_1", "email.bounced", message.token, "<b>x</b>", None, "bounced", ()
        )
        assert box.store.provider_event_record(event).advanced
        page = logged_in(create_app(box, ConsoleSettings(users=USERS))).get(
            "/keys/digest/customer-1"
        )
        assert "the provider reports it" in page.text and ">bounced</span>" in page.text
    finally:
        box.close()


def test_a_fan_out_whose_owner_is_gone_is_an_alert_and_its_period_says_whose_it_is(tmp_path):
    box = scheduled_box(f"sqlite:///{tmp_path / 'fan-out.db'}", customers=2)
    try:
        with FrozenClock(box, at=MONDAY_W33) as clock:
            schedule = box.schedules["weekly-digest"]
            box.store.schedule_state(schedule.name, schedule.grace)
            assert FanOut(box.runtime, "vm-7:4242:manual").claim(schedule, "2026-W33", None).claimed
            clock.advance(timedelta(minutes=1))  # not renewed for a minute: gone
            web = logged_in(create_app(box, ConsoleSettings(users=USERS)), "vic")
            overview, periods = web.get("/").text, web.get("/periods").text
        alert = (
            "The fan-out of weekly-digest 2026-W33 has lost its owner vm-7:4242:manual (last "
            "renewed 2026-08-10T09:00:00Z); its lease ends 2026-08-10T09:05:00Z. Take it over now:"
        )
        assert alert in unescape(overview), overview
        assert re.search(r"owner vm-7:4242:manual <span class=\"tag bad\">gone</span>", periods)
        assert "lease ends 2026-08-10T09:05:00Z" in periods
    finally:
        box.close()


NO_SHIPMENTS = "no shipments for {}\nin {}"  # two lines (the traceback quotes the raise)


def week_box(path: Path) -> Box:
    """A fanned-out week of four customers' digests: customer 2's message refused for good (dead),
    3's held, 4's job raised (dead, its error a traceback); 1's sent."""
    box = Box(f"sqlite:///{path}", secret="console-test-secret-0123456789")
    box.channel("email", provider=ScriptedProvider())

    @box.task(key="weekly-digest/customer-{customer}/{period}", retry=Retry(max_attempts=1))
    def digest(ctx: JobContext, customer: int, period: str) -> None:
        if customer == 4:
            raise ValueError(NO_SHIPMENTS.format(XSS, period))
        ctx.outbox.email(to=f"c{customer}@freight.example", subject="Your week", text="Hello")

    @box.schedule(
        "weekly-digest", cron="0 9 * * MON", period=iso_week, task=digest, slo=Slo("4h", 0.5)
    )
    def customers(ctx: ScheduleContext) -> Any:
        for customer in (1, 2, 3, 4):
            yield {"customer": customer, "period": ctx.period}

    box.run_schedule("weekly-digest", "2026-W33")
    work_seeded(box)
    return box


DEAD_JOB_KEY = "weekly-digest/customer-4/2026-W33"


def test_a_periods_page_shows_a_dead_jobs_first_line_and_its_traceback_behind_a_disclosure(
    tmp_path,
):
    box = week_box(tmp_path / "week.db")
    try:
        [job] = box.store.job_find_by_key(DEAD_JOB_KEY)
        assert job.state == "dead" and job.last_error and "\n" in job.last_error
        page = logged_in(create_app(box, ConsoleSettings(users=USERS)), "vic").get(
            "/periods/weekly-digest/2026-W33"
        )
        row = re.search(rf"<tr><td>{job.id}</td>.*?</tr>", page.text, re.S)
        assert row, page.text
        why = re.search(
            r"<details><summary>(.*?)</summary><pre>(.*?)</pre></details>", row.group(0), re.S
        )
        assert why, row.group(0)  # the first line, and the rest behind a disclosure
        summary, rest = unescape(why.group(1)), unescape(why.group(2))
        assert summary == f"ValueError: no shipments for {XSS}"
        assert rest.startswith("in 2026-W33\n") and 'File "' in rest and "\n" in rest
        assert "\\n" not in row.group(0)  # no line break shown as an escape
        assert "<script>" not in row.group(0) and "&lt;script&gt;" in why.group(1)
    finally:
        box.close()


def error_cells(html: str) -> list[str]:
    return re.findall(r'<td class="error">(.*?)</td>', html, re.S)


def test_a_row_without_an_error_shows_no_error_mark(app, store_box):
    """A healthy row's error cell is empty, not a red dash: red means something failed."""
    web = logged_in(app, "vic")
    jobs = web.get("/jobs").text
    failed = [j for j in store_box.store.job_list(JobFilter(limit=50)) if j.last_error]
    assert len(error_cells(jobs)) == len(failed), error_cells(jobs)
    for path in ["/outbox", "/keys/digest/customer-1", "/jobs", "/dead", "/held"]:
        page = web.get(path).text
        assert [c for c in error_cells(page) if c.strip() in ("", "—")] == [], path
    chain = web.get("/keys/digest/customer-1").text  # a first-try send: one healthy attempt
    assert error_cells(chain) == [], error_cells(chain)


def test_a_count_of_one_is_singular_on_the_overview(app, store_box):
    status = status_data(store_box, periods=1)
    assert (status["jobs"]["dead"], status["outbox"]["dead"], status["ambiguous"]) == (1, 1, 1)
    assert status["jobs"]["ready"] == 1  # the export waiting on its limit
    page = " ".join(unescape(re.sub(r"<[^>]+>", " ", logged_in(app, "vic").get("/").text)).split())
    assert "1 job, 1 message" in page
    assert "1 held send " in page and "1 job ready" in page and "2 dead letters" in page
    assert not re.search(r"\b1 (jobs|messages|held sends|dead letters|live workers)\b", page)


def test_a_one_letter_batch_is_named_in_the_singular(tmp_path):
    box = dead_world(tmp_path)
    try:
        app = create_app(box, ConsoleSettings(users=USERS))
        web = logged_in(app)
        page = web.get("/dead/plan", params={"do": "replay", "error": "down 1"}).text
        assert 'data-figure="planned">1<' in page and "these 1" not in page
        [fields] = form_fields(page, "/dead/batch")
        done = web.post("/dead/batch", data={**fields, "reason": "r"}, headers={"origin": BASE})
        batch_id = done.headers["location"].rsplit("/", 1)[1]
        wait_until(lambda: app.state.batches.get(batch_id).finished, what="the batch")
        shown = " ".join(re.sub(r"<[^>]+>", " ", web.get(done.headers["location"]).text).split())
        assert "Replaying 1 dead letter " in shown, shown
    finally:
        box.close()


def test_the_held_send_form_makes_the_operator_choose_what_happened(tmp_path):
    """Neither answer is chosen in advance: "it arrived" recorded by default would mark a lost
    message as sent. A form sent without a choice is refused, and nothing changes."""
    box = week_box(tmp_path / "held.db")
    try:
        [held] = box.store.outbox_find_by_key("weekly-digest/customer-3/2026-W33")
        assert held.state == "ambiguous"
        web = logged_in(create_app(box, ConsoleSettings(users=USERS)))
        page = web.get("/held").text
        [form] = re.findall(
            r'<form method="post" action="[^"]*/held/resolve".*?</form>', page, re.S
        )
        choices = re.findall(r"<input[^>]*name=\"resolution\"[^>]*>", form)
        assert sorted(re.search(r'value="(\w+)"', c).group(1) for c in choices) == [  # type: ignore[union-attr]
            "resend",
            "sent",
        ], form
        assert all("required" in c and "checked" not in c for c in choices), choices
        assert "selected" not in form
        [fields] = form_fields(page, "/held/resolve")
        done = web.post(
            "/held/resolve", data={**fields, "reason": "looks fine"}, headers={"origin": BASE}
        )
        assert done.status_code == 303
        notice = unescape(web.get(done.headers["location"]).text)
        assert "Nothing resolved: say whether the message arrived" in notice, notice
        row = box.store.outbox_get(held.id)
        assert row is not None and row.state == "ambiguous"
        assert box.store.audit_search(AuditFilter(limit=10)) == []
    finally:
        box.close()


def period_figures(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-period-figure="(\w+)">(\d+)<', html))


def test_after_a_replay_the_period_figures_agree_with_the_tiles(tmp_path):
    """The period figures are kept between pages (they read every job of their periods): a page
    that finds the store moved since recomputes them with its tiles, so a replay shows at once in
    both, and the page says they are current."""
    box = week_box(tmp_path / "replay.db")
    try:
        web = logged_in(create_app(box, ConsoleSettings(users=USERS)))
        before = web.get("/").text
        assert dict(re.findall(r'data-figure="(\w+)">(\d+)<', before))["dead"] == "2"
        assert period_figures(before)["dead"] == "2"  # customer 4's job, 2's message
        [fields] = form_fields(web.get(f"/keys/{DEAD_JOB_KEY}").text, "/dead/replay")
        web.post("/dead/replay", data={**fields, "reason": "fixed"}, headers={"origin": BASE})
        for path in ["/", "/overview/tiles"]:
            after = web.get(path).text
            assert dict(re.findall(r'data-figure="(\w+)">(\d+)<', after))["dead"] == "1", path
            assert period_figures(after)["dead"] == "1", path
            assert period_figures(after)["pending"] == "1", path  # the replayed job waits
            assert "no job or message has moved since" in after, path
        assert period_figures(web.get("/periods").text)["dead"] == "1"
    finally:
        box.close()


def test_period_figures_too_costly_to_recompute_on_a_page_say_how_old_they_are(
    tmp_path, monkeypatch
):
    box = week_box(tmp_path / "costly.db")
    try:
        web = logged_in(create_app(box, ConsoleSettings(users=USERS)))
        assert period_figures(web.get("/").text)["dead"] == "2"
        monkeypatch.setattr("oncebox.status.RECOMPUTE_ON_READ_WITHIN", 0.0)
        box.replay(DEAD_JOB_KEY, reason="fixed", actor="olga")
        for path in ["/", "/periods"]:
            page = " ".join(unescape(web.get(path).text).split())
            assert period_figures(page)["dead"] == "2", path  # as they were
            assert re.search(
                r"Period figures as of \d+s ago: jobs or messages have moved since", page
            ), path
    finally:
        box.close()

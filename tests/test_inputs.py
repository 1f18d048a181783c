"""Inputs that answered 500 with a traceback in the log (issue 44, item 6), on both stores: each
is refused with one line that says what is wrong and where — 400 on a console page, a notice
after a console action, a problem detail at the API, exit 2 at the CLI, a ConfigurationError for
a channel's URL — and a signed provider event no store can keep is acknowledged (200: the
provider stops sending it) and counted. `tests/test_fuzz_inputs.py` drives every route with
arbitrary input; these pin the cases found by hand."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from starlette.testclient import TestClient

from oncebox import ConfigurationError
from oncebox.cli.app import main
from oncebox.kernel import clock
from oncebox.providers import from_url
from oncebox.providers.webhook import WebhookProvider
from oncebox.providers.webhook_signatures import sign_webhook, signing_key
from support.reports import SECRET, signed
from support.surfaces import Surfaces, action_id, clients, notices, operator, seeded_surfaces
from test_cli_inputs import assert_refused

HUGE = "9" * 23  # past 2^63 - 1, the largest row id either store keeps
NUL = "a\x00b"


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def seeded(request: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Surfaces]:
    """One seeded store per dialect for the module: each test leaves its rows as it found them
    (what it checks is that nothing changed) and counts from where the last one left off."""
    with seeded_surfaces(request.param, request, tmp_path_factory.mktemp("inputs")) as found:
        yield found


@pytest.fixture
def web(seeded: Surfaces) -> Iterator[tuple[TestClient, TestClient, TestClient]]:
    with clients(seeded) as started:
        yield started


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


# -- the console ------------------------------------------------------------------------------


def refusal(page: Any) -> str:
    """The one error a console page shows, on one line."""
    assert "Traceback" not in page.text
    [said] = re.findall(r'<p class="notice error">(.*?)</p>', page.text, re.S)
    return one_line(html.unescape(said))


FILTERS = [
    ("/jobs", "task"),
    ("/jobs", "queue"),
    ("/jobs", "schedule"),
    ("/jobs", "period"),
    ("/jobs", "key_prefix"),
    ("/outbox", "channel"),
    ("/outbox", "period"),
    ("/outbox", "key_prefix"),
    ("/audit", "key"),
    ("/audit", "action"),
    ("/dead", "task"),
    ("/dead", "channel"),
    ("/dead", "error"),
    ("/dead", "period"),
    ("/dead/plan", "task"),
    ("/dead/plan", "error"),
]


@pytest.mark.parametrize(("path", "field"), FILTERS)
def test_a_console_filter_no_store_can_hold_is_refused_with_one_line(web, seeded, path, field):
    console, _, _ = web
    operator(seeded.console, console)
    answer = console.get(path, params={field: NUL})
    assert answer.status_code == 400, answer.text[:300]
    said = refusal(answer)
    assert f"filter {field!r}" in said and "NUL" in said, said


@pytest.mark.parametrize(
    "path", ["/periods/weekly-digest/2026-W3%00", "/periods/weekly%00digest/2026-W33"]
)
def test_a_period_page_named_with_a_nul_is_refused_with_one_line(web, seeded, path):
    console, _, _ = web
    operator(seeded.console, console)
    answer = console.get(path)
    assert answer.status_code == 400, answer.text[:300]
    assert "NUL" in refusal(answer)


@pytest.mark.parametrize("path", ["/jobs", "/outbox", "/held", "/audit"])
@pytest.mark.parametrize("before", [HUGE, "12a", "-1"])
def test_a_before_that_is_no_row_id_is_refused_with_one_line(web, seeded, path, before):
    console, _, _ = web
    operator(seeded.console, console)
    answer = console.get(path, params={"before": before})
    assert answer.status_code == 400, answer.text[:300]
    assert "before=" in refusal(answer)


def test_paging_with_before_still_pages(web, seeded):
    console, _, _ = web
    operator(seeded.console, console)
    newest = max(row.id for row in seeded.box.store.job_list(_jobs()))
    page = console.get("/jobs", params={"before": str(newest)})
    assert page.status_code == 200
    assert f"/jobs/{newest}" not in page.text and "weekly-digest/customer-" in page.text


def _jobs() -> Any:
    from oncebox.store.params import JobFilter

    return JobFilter(limit=50)


@pytest.mark.parametrize(
    ("route", "fields", "said"),
    [
        ("/dead/replay", {"id": HUGE, "kind": "job", "reason": "r"}, "Nothing replayed: no row"),
        ("/dead/discard", {"id": HUGE, "kind": "job", "reason": "r"}, "Nothing discarded: no row"),
        (
            "/held/resolve",
            {"id": HUGE, "resolution": "sent", "reason": "r"},
            "Nothing resolved: no row",
        ),
        (
            "/dead/replay",
            {"kind": "job", "reason": NUL},
            "Nothing replayed: the reason holds a NUL",
        ),
        (
            "/held/resolve",
            {"resolution": "sent", "reason": "r", "receipt": NUL},
            "Nothing resolved: the receipt holds a NUL",
        ),
    ],
)
def test_a_console_action_on_input_no_store_can_hold_says_why_nothing_happened(
    web, seeded, route, fields, said
):
    console, _, _ = web
    csrf = operator(seeded.console, console)
    store = seeded.box.store
    if "id" not in fields:  # the real row: only the text is wrong
        target = (
            store.job_list(_dead_jobs())[0].id
            if route.startswith("/dead")
            else store.outbox_list(_held())[0].id
        )
        fields = {**fields, "id": str(target)}
    form = {**fields, "csrf": csrf, "action_id": action_id()}
    answer = console.post(route, data=form, headers={"origin": "http://console.test"})
    assert answer.status_code == 303, answer.text[:300]
    shown = notices(console)
    assert any(said in text for text in shown), shown
    assert store.job_count_by_state().counts.get("dead") == 1
    assert store.outbox_count_by_state().counts.get("ambiguous") == 1


def _dead_jobs() -> Any:
    from oncebox.store.params import JobFilter

    return JobFilter(state="dead", limit=5)


def _held() -> Any:
    from oncebox.store.params import OutboxFilter

    return OutboxFilter(state="ambiguous", limit=5)


# -- the delivery receiver --------------------------------------------------------------------

TOKEN = "0" * 32


@pytest.mark.parametrize(
    "payload",
    [
        {"type": "email.sent\x00", "data": {"tags": {"oncebox": TOKEN}}},
        {"type": "email.sent\ud800", "data": {}},
        {"type": "email.delivered", "data": {"email_id": "re_\x00", "tags": {"oncebox": TOKEN}}},
        {"type": "email.delivered", "data": {"email_id": "re_\udfff"}},
    ],
    ids=["nul-type", "surrogate-type", "nul-email-id", "surrogate-email-id"],
)
def test_a_signed_event_no_store_can_keep_is_acknowledged_and_counted(web, seeded, payload):
    _, _, receiver = web
    before = seeded.box.store.counter_list()
    body, headers = signed(payload)
    answer = receiver.post("/email", content=body, headers=headers)
    assert answer.status_code == 200, answer.text  # a provider retries anything else
    assert answer.json()["outcome"] == "unstorable"
    assert "NUL" in answer.json()["detail"] or "surrogate" in answer.json()["detail"]
    after = seeded.box.store.counter_list()
    assert _grew(before, after) == {"provider_events_unstorable": 1}, (before, after)


def _grew(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


@pytest.mark.parametrize("raw", [b"[1, 2]", b"\xff\xfe", b"not json", b'"text"'])
def test_a_signed_body_that_is_not_a_json_object_is_acknowledged_as_unreadable(web, seeded, raw):
    _, _, receiver = web
    before = seeded.box.store.counter_list()
    stamp = str(int(clock.real_now().timestamp()))
    headers = {
        "svix-id": "msg_1",
        "svix-timestamp": stamp,
        "svix-signature": sign_webhook(signing_key(SECRET), "msg_1", stamp, raw),
    }
    answer = receiver.post("/email", content=raw, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "unreadable"
    after = seeded.box.store.counter_list()
    assert _grew(before, after) == {"provider_events_unreadable": 1}, (before, after)


# -- the CLI ----------------------------------------------------------------------------------


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def refused(result: Result) -> str:
    """Exit 2 and one line (`test_cli_inputs.assert_refused`: click's usage errors add their
    usage hint to their one `Error:` line)."""
    assert "unexpected" not in result.output
    return assert_refused(result, 2)


@pytest.mark.parametrize(
    "command",
    [
        ["jobs", "show", HUGE],
        ["jobs", "cancel", HUGE, "--reason", "r"],
        ["outbox", "show", HUGE],
        ["dlq", "show", HUGE],
        ["dlq", "replay", HUGE, "--reason", "r"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_a_cli_id_past_any_row_id_is_refused_with_one_line(seeded, command):
    line = refused(run(*command, "--db", seeded.url))
    assert HUGE in line and "9223372036854775807" in line, line


@pytest.mark.parametrize("group", [["jobs", "list"], ["outbox", "list"], ["audit", "list"]])
def test_a_cli_before_past_any_row_id_is_refused_with_one_line(seeded, group):
    line = refused(run(*group, "--before", HUGE, "--db", seeded.url))
    assert "'--before'" in line and "9223372036854775807" in line, line


# -- the webhook channel's URL ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("port", "said"),
    [("99999", "port 99999"), ("abc", "port 'abc'"), ("0", "port 0"), ("-1", "port '-1'")],
)
def test_a_webhook_url_with_a_port_out_of_range_is_a_configuration_error(port, said):
    url = f"webhook+https://hooks.example:{port}/in"
    for build in (WebhookProvider, from_url):
        with pytest.raises(ConfigurationError) as caught:
            build(url)
        message = str(caught.value)
        assert said in message and "1-65535" in message and "webhook URL" in message, message


# -- tokens compared ---------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/dead/replay", "/logout"])
def test_a_csrf_token_that_is_not_ascii_is_refused_not_a_server_error(web, seeded, route):
    console, _, _ = web
    operator(seeded.console, console)
    form = {"csrf": "tok\u00e9n", "action_id": action_id(), "id": "1", "reason": "r"}
    answer = console.post(route, data=form, headers={"origin": "http://console.test"})
    assert answer.status_code == 403, answer.text[:300]
    assert one_line(answer.text) == "refused: missing or wrong CSRF token"


def test_a_login_form_token_that_is_not_ascii_is_refused_not_a_server_error(web):
    console, _, _ = web
    console.cookies.set("oncebox_login", "nonce")
    form = {"login_csrf": "n\u00f6nce", "name": "olga", "password": "x"}
    answer = console.post("/login", data=form, headers={"origin": "http://console.test"})
    assert answer.status_code == 400, answer.text[:300]
    assert "The login form expired" in answer.text


@pytest.mark.parametrize("referer", ["http://[", "http://[::1", "http://a]b/"])
@pytest.mark.parametrize("route", ["/login", "/logout"])
def test_a_referer_no_url_parser_reads_is_no_origin_not_a_server_error(web, route, referer):
    """Without an Origin the Referer's origin is compared; `urlsplit` raises on `http://[`, and
    anyone may send one, logged in or not (found by review)."""
    console, _, _ = web
    answer = console.post(route, data={"csrf": "x"}, headers={"referer": referer})
    assert answer.status_code == 403, answer.text[:300]
    assert one_line(answer.text) == "refused: not from this console's origin"


# -- the API ---------------------------------------------------------------------------------


@pytest.mark.parametrize("reason", ["a\x00b", "a\ud800b"], ids=["nul", "surrogate"])
def test_an_api_replay_whose_reason_no_store_keeps_is_refused_with_what_is_wrong(
    web, seeded, reason
):
    _, api, _ = web
    [dead] = seeded.box.store.job_list(_dead_jobs())
    answer = api.post(
        f"/v1/dead-letters/{dead.id}/replay",
        content=json.dumps({"reason": reason}),  # a lone surrogate as JSON's escape
        headers={"Authorization": f"Bearer {seeded.token}", "Content-Type": "application/json"},
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"].startswith("the reason holds a "), answer.json()
    assert seeded.box.store.job_get(dead.id).state == "dead"

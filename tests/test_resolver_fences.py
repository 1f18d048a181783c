"""The resolver writes only what it judged, fenced in the statement that writes it: a held send
any provider event names stays for a person whatever a lookup or its idempotency key answers; a
resolver that judged an earlier hold of a row (a stale page) does not resolve the hold that
followed; and an event recorded between the resolver's check and its write stops the write —
also on PostgreSQL while the event's transaction holds the row and the write waits for it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from starlette.testclient import TestClient

from oncebox import Box, Reports, Retry
from oncebox.api.deliveries import create_receiver
from oncebox.chaos.mutations import mutated
from oncebox.fakes.email_api import FakeEmailApi
from oncebox.kernel import points
from oncebox.lanes.resolver import AmbiguityResolver, ResolverResult
from oncebox.providers import Outgoing, Receipt
from oncebox.store.records import OutboxRow
from oncebox.testing import drain
from support.contract import advance
from support.db import lock_waits
from support.outbox import enqueue_customers
from support.reports import SECRET, SECRET_ENV, LostAcks
from support.waiting import wait_until
from test_provider_reports import event, post

KEY = "weekly-digest/customer-1/2026-W33"


class Finds(LostAcks):
    """The same, with a lookup that finds every message it took."""

    def status(self, outgoing: Outgoing, idempotency_key: str) -> tuple[str, Receipt | None]:
        if outgoing.token in self.received:
            return "sent", Receipt(f"found-{outgoing.token[:6]}")
        return "not_found", None


class Trails(LostAcks):
    """The same, with a lookup whose search trails its intake by half an hour: it never finds a
    recent send (after the lag, "not_found" is taken at its word)."""

    lookup_lag = timedelta(minutes=30)

    def status(self, outgoing: Outgoing, idempotency_key: str) -> tuple[str, Receipt | None]:
        return "not_found", None


@pytest.fixture(autouse=True)
def secret_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)


@pytest.fixture
def api() -> Iterator[FakeEmailApi]:
    with FakeEmailApi() as server:
        yield server


@pytest.fixture
def client_for() -> Iterator[Callable[[Box], TestClient]]:
    clients: list[TestClient] = []

    def make(box: Box) -> TestClient:
        client = TestClient(create_receiver(box))
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@dataclass(frozen=True)
class Outcome:
    state: str  # the row's, at the end
    sends: int  # copies the provider took
    audits: tuple[str, ...]  # "actor resolve-…" per audit row
    result: ResolverResult | None = None  # the resolver's round that raced


def row_of(box: Box) -> OutboxRow:
    [row] = box.store.outbox_find_by_key(KEY)
    return row


def held(box: Box) -> OutboxRow:
    """The customer's message sent, its acknowledgement lost: held."""
    enqueue_customers(box, [1])
    drain(box, raise_on_failure=False)
    row = row_of(box)
    assert row.state == "ambiguous", row
    return row


def outcome(box: Box, sends: int, result: ResolverResult | None = None) -> Outcome:
    row = row_of(box)
    audits = tuple(f"{a.actor} {a.action}" for a in box.store.audit_list(target_id=row.id))
    return Outcome(row.state, sends, audits, result)


def resolver_round(box: Box, into: dict[str, ResolverResult]) -> threading.Thread:
    def run() -> None:
        into["result"] = AmbiguityResolver(box.store, box.channels).run_once()

    thread = threading.Thread(target=run, name="slow-resolver", daemon=True)
    thread.start()
    return thread


# -- 1. a held send any event names stays held ----------------------------------------------------


def reported_failed_then_resolved(
    mail_box: Callable[..., Box], client_for: Callable[[Box], TestClient], url: str, via: Any
) -> Outcome:
    """A held send its provider then reports `failed`, and a resolver round; `via` is how the
    provider can be asked — an idempotency key it honours (the fake API), or a lookup that
    finds the message."""
    api = via if isinstance(via, FakeEmailApi) else None
    if api is not None:  # the key is honoured for 24 h: the row is held well inside the window
        box = mail_box(
            url,
            api.url + "?timeout=1",
            retry=Retry(max_attempts=1),
            reports=Reports(secret_env=SECRET_ENV),
        )
        api.script("accept-then-timeout:2")
    else:
        box = mail_box(url, via, reports=Reports(secret_env=SECRET_ENV))
    row = held(box)
    answer = post(client_for(box), event("email.failed", row.token))
    assert answer.json() == {"outcome": "recorded", "stage": "failed", "settled": False}
    result = AmbiguityResolver(box.store, box.channels).run_once()
    sends = len(api.delivered) if api is not None else len(via.received)
    return outcome(box, sends, result)


@pytest.mark.parametrize("via", ["idempotency-key", "lookup"])
def test_a_send_reported_failed_stays_held_whatever_the_provider_answers(
    store_url, mail_box, client_for, api, via
):
    provider = api if via == "idempotency-key" else Finds()
    settled = reported_failed_then_resolved(mail_box, client_for, store_url, provider)
    assert (settled.state, settled.audits, settled.sends) == ("ambiguous", (), 1), settled
    assert settled.result is not None and settled.result.unknown == 1, settled


def test_a_send_reported_failed_is_settled_sent_without_its_fence(
    store_url, mail_box, client_for, api
):
    with mutated("resolver-ignores-reports"):
        settled = reported_failed_then_resolved(mail_box, client_for, store_url, api)
    assert (settled.state, settled.audits) == ("sent", ("resolver resolve-sent",)), settled


# -- 2. a stale page ------------------------------------------------------------------------------


def resolved_from_a_stale_page(mail_box: Callable[..., Box], url: str) -> Outcome:
    """Two workers' resolvers judge the same held row; the slow one pauses after judging while
    the other resends it, its dispatcher sends it and its outcome is unknown again (held anew,
    owed the lookup's lag afresh); then the slow one writes what it judged of the old hold."""
    provider = Trails()
    slow, other = mail_box(url, provider), mail_box(url, provider)
    held(slow)
    advance(slow.store, timedelta(minutes=30))  # the lookup's lag, since the first hold
    judged = points.Pause(only=lambda thread: thread == "slow-resolver", timeout=20)
    raced: dict[str, ResolverResult] = {}
    with points.installed({"resolver.judged": judged}):
        slow_round = resolver_round(slow, raced)
        assert judged.reached.wait(10), "the slow resolver never judged its row"
        assert AmbiguityResolver(other.store, other.channels).run_once().resent == 1
        drain(other, raise_on_failure=False)
        again = row_of(other)
        assert (again.state, len(provider.received)) == ("ambiguous", 2), again
        judged.release()
        slow_round.join(10)
    assert not slow_round.is_alive()
    drain(other, raise_on_failure=False)  # whatever the slow resolver made due is sent now
    return outcome(other, len(provider.received), raced.get("result"))


def test_a_resolver_working_from_a_stale_page_does_not_resend_the_new_hold(store_url, mail_box):
    raced = resolved_from_a_stale_page(mail_box, store_url)
    assert (raced.state, raced.sends) == ("ambiguous", 2), raced
    assert raced.audits == ("resolver resolve-resend",), raced  # the other worker's only
    assert raced.result is not None and raced.result.resent == 0, raced


def test_a_resolver_working_from_a_stale_page_sends_a_third_copy_without_its_fence(
    store_url, mail_box
):
    with mutated("resolver-stale-attempt"):
        raced = resolved_from_a_stale_page(mail_box, store_url)
    assert raced.sends == 3, raced


class Forgets(LostAcks):
    """Idempotent for an hour, then it forgets the key; never answers; a lookup that never finds
    anything."""

    name = "forgets"
    idempotent = True
    idempotency_window = timedelta(hours=1)

    def status(self, outgoing: Outgoing, idempotency_key: str) -> tuple[str, Receipt | None]:
        return "not_found", None


def resolved_from_a_stale_page_over_a_hold_that_spent_no_attempt(
    mail_box: Callable[..., Box], url: str
) -> Outcome:
    """The same race, where the row is held anew without spending an attempt: the other
    worker's resend is leased and its dispatcher dies before sending; its lease runs out past
    the provider's window, so the rescue holds it (a resend could duplicate) — same attempt
    count, a new hold."""
    provider = Forgets()
    slow = mail_box(url, provider, retry=Retry(max_attempts=1))
    other = mail_box(url, provider, retry=Retry(max_attempts=1))
    first = held(slow)
    advance(slow.store, timedelta(minutes=55))  # too late for a replay under the key
    judged = points.Pause(only=lambda thread: thread == "slow-resolver", timeout=20)
    died = points.raising(RuntimeError("the dispatcher died after its lease"))
    raced: dict[str, ResolverResult] = {}
    with points.installed({"resolver.judged": judged}):
        slow_round = resolver_round(slow, raced)
        assert judged.reached.wait(10), "the slow resolver never judged its row"
        assert AmbiguityResolver(other.store, other.channels).run_once().resent == 1
        with points.installed({"dispatcher.after_lease": died}), pytest.raises(RuntimeError):
            other.dispatcher().run_once()
        advance(other.store, timedelta(hours=2))  # the lease ran out, and the window passed
        drain(other, raise_on_failure=False)  # the rescue holds it
        again = row_of(other)
        assert (again.state, again.attempt) == ("ambiguous", first.attempt), again
        judged.release()
        slow_round.join(10)
    assert not slow_round.is_alive()
    drain(other, raise_on_failure=False)
    return outcome(other, len(provider.received), raced.get("result"))


def test_a_stale_judgement_does_not_resolve_a_later_hold_that_spent_no_attempt(store_url, mail_box):
    raced = resolved_from_a_stale_page_over_a_hold_that_spent_no_attempt(mail_box, store_url)
    assert (raced.state, raced.sends) == ("ambiguous", 1), raced
    assert raced.result is not None and raced.result.resent == 0, raced


def test_a_stale_judgement_resends_a_later_hold_past_the_window_without_its_fence(
    store_url, mail_box
):
    with mutated("resolver-stale-attempt"):
        raced = resolved_from_a_stale_page_over_a_hold_that_spent_no_attempt(mail_box, store_url)
    assert raced.sends == 2, raced  # the provider forgot the key: a second copy


# -- 3. a report between the check and the write ---------------------------------------------------


def reporting(mail_box: Callable[..., Box], url: str, provider: LostAcks) -> Box:
    """A channel whose provider reports every message it takes: no event within the grace (none
    here) means it never took it, and the resolver resends."""
    reports = Reports(secret_env=SECRET_ENV, grace=timedelta(0), unreported="resend")
    return mail_box(url, provider, reports=reports)


def reported_while_judged(
    mail_box: Callable[..., Box], client_for: Callable[[Box], TestClient], url: str, kind: str
) -> Outcome:
    """The resolver judges a held row unreported; the provider's event about it is recorded
    (and committed) before the resolver writes."""
    provider = LostAcks()
    box = reporting(mail_box, url, provider)
    row = held(box)
    client = client_for(box)
    judged = points.Pause(only=lambda thread: thread == "slow-resolver", timeout=20)
    raced: dict[str, ResolverResult] = {}
    with points.installed({"resolver.judged": judged}):
        resolving = resolver_round(box, raced)
        assert judged.reached.wait(10), "the resolver never judged the row"
        assert post(client, event(kind, row.token)).json()["outcome"] == "recorded"
        judged.release()
        resolving.join(10)
    assert not resolving.is_alive()
    drain(box, raise_on_failure=False)
    return outcome(box, len(provider.received), raced.get("result"))


@pytest.mark.parametrize("kind", ["email.failed", "email.suppressed"])
def test_a_report_recorded_after_the_resolvers_check_stops_its_write(
    store_url, mail_box, client_for, kind
):
    raced = reported_while_judged(mail_box, client_for, store_url, kind)
    assert (raced.state, raced.sends, raced.audits) == ("ambiguous", 1, ()), raced
    assert raced.result is not None and raced.result.unknown == 1, raced


def test_a_report_recorded_after_the_resolvers_check_is_resent_over_without_its_fence(
    store_url, mail_box, client_for
):
    with mutated("resolver-report-race"):
        raced = reported_while_judged(mail_box, client_for, store_url, "email.failed")
    assert raced.sends == 2, raced


def reported_while_written(
    mail_box: Callable[..., Box], client_for: Callable[[Box], TestClient], url: str, kind: str
) -> Outcome:
    """The event's transaction has recorded it and holds the row; the resolver, which saw no
    event (not committed yet), writes and waits for the row; then the event commits."""
    provider = LostAcks()
    box = reporting(mail_box, url, provider)
    row = held(box)
    client = client_for(box)
    recorded = points.Pause(timeout=20)
    raced: dict[str, ResolverResult] = {}
    answers: list[Any] = []
    with points.installed({"provider_event.recorded": recorded}):
        receiving = threading.Thread(
            target=lambda: answers.append(post(client, event(kind, row.token))), daemon=True
        )
        receiving.start()
        assert recorded.reached.wait(10), "the event was never recorded"
        resolving = resolver_round(box, raced)
        wait_until(lambda: lock_waits(url) == 1, what="the resolver's write to wait on the row")
        recorded.release()
        receiving.join(10)
        resolving.join(10)
    assert not receiving.is_alive() and not resolving.is_alive()
    assert answers and answers[0].json()["outcome"] == "recorded", answers
    drain(box, raise_on_failure=False)
    return outcome(box, len(provider.received), raced.get("result"))


@pytest.mark.postgres
@pytest.mark.parametrize("kind", ["email.failed", "email.suppressed"])
def test_a_report_committed_while_the_resolvers_write_waits_for_the_row_stops_it(
    pg_url, mail_box, client_for, kind
):
    raced = reported_while_written(mail_box, client_for, pg_url, kind)
    assert (raced.state, raced.sends, raced.audits) == ("ambiguous", 1, ()), raced


@pytest.mark.postgres
def test_a_report_committed_while_the_resolvers_write_waits_is_resent_over_without_its_fence(
    pg_url, mail_box, client_for
):
    with mutated("resolver-report-race"):
        raced = reported_while_written(mail_box, client_for, pg_url, "email.suppressed")
    assert raced.sends == 2, raced

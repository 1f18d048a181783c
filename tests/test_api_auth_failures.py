"""The API slows an address that sends bad keys (issue 44: rate limits on the API's auth
failures): past `ApiSettings.auth_failures` refused requests in a window, its requests are
answered 429 with `Retry-After` before any key is looked up — a burst counted as one step, so no
more than the limit are ever verified — while a key that authenticated here before, and every
other address, go on as usual. The table of addresses is bounded, and the refusals are counted.

Real requests: uvicorn on loopback, each caller binding its own source address (127.0.0.x)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from oncebox import Box
from oncebox.api import ApiSettings, create_api
from oncebox.api.auth_failures import AuthFailures
from oncebox.api.keys import ApiKey, issue_key
from oncebox.examples.logistics.app import build_box, create_tables
from oncebox.limits.rates import Limit
from support.api_server import served

ATTACKER, NEIGHBOUR, OTHER = "127.0.0.2", "127.0.0.3", "127.0.0.4"
BAD = "Bearer obx_999_not-a-secret"
JOBS = "/v1/jobs/1"  # read scope; a 404 once admitted


@pytest.fixture
def freight(tmp_path: Path) -> Iterator[Box]:
    box = build_box(f"sqlite:///{tmp_path / 'api.db'}", email=f"file://{tmp_path / 'sent'}")
    create_tables(box)
    yield box
    box.close()


def token(box: Box, name: str) -> str:
    return f"Bearer {issue_key(box.store, name, ['read'], rate='1000/s', by='test').token}"


@contextmanager
def api(box: Box, limit: str = "5/min") -> Iterator[Callable[[str], httpx.Client]]:
    """The API served with `limit`; clients bound to a source address each. The counters are
    written when the server stops (the block's end)."""
    clients: list[httpx.Client] = []
    with served(create_api(box, ApiSettings(auth_failures=limit))) as base:

        def client(address: str) -> httpx.Client:
            made = httpx.Client(
                base_url=base, transport=httpx.HTTPTransport(local_address=address), timeout=60
            )
            clients.append(made)
            return made

        try:
            yield client
        finally:
            for made in clients:
                made.close()


def get(client: httpx.Client, authorization: str | None) -> httpx.Response:
    headers = {} if authorization is None else {"Authorization": authorization}
    return client.get(JOBS, headers=headers)


def kind(answer: httpx.Response) -> str:
    return str(answer.json()["type"]).rpartition(":")[2]


def test_an_address_sending_bad_keys_is_answered_429_past_the_limit(freight):
    with api(freight) as client:
        attacker = client(ATTACKER)
        answers = [get(attacker, BAD if i % 2 else None) for i in range(5)]
        assert [a.status_code for a in answers] == [401] * 5
        throttled = get(attacker, BAD)
        assert throttled.status_code == 429, throttled.text
        assert kind(throttled) == "auth-throttled"
        assert 1 <= int(throttled.headers["retry-after"]) <= 60
        assert "missing or wrong API key" in throttled.json()["detail"]
    counters = freight.store.counter_list()
    assert (counters.get("api_auth_refused"), counters.get("api_auth_throttled")) == (5, 1)


def test_no_valid_key_is_locked_out_by_another_addresses_failures(freight):
    good = token(freight, "neighbour")
    with api(freight) as client:
        attacker, neighbour = client(ATTACKER), client(NEIGHBOUR)
        for _ in range(6):
            get(attacker, BAD)
        assert get(attacker, BAD).status_code == 429
        assert get(neighbour, good).status_code == 404  # admitted: no job 1
        assert get(neighbour, BAD).status_code == 401  # its own count: not throttled


def test_a_key_that_authenticated_before_passes_its_throttled_address(freight):
    """Behind a proxy or a NAT, callers share an address: one client's bad keys do not lock the
    others' good ones out (a good key never seen here waits out the window)."""
    seen, unseen = token(freight, "seen"), token(freight, "unseen")
    with api(freight) as client:
        shared = client(ATTACKER)
        assert get(shared, seen).status_code == 404
        for _ in range(5):
            assert get(shared, BAD).status_code == 401
        assert get(shared, BAD).status_code == 429
        assert get(shared, seen).status_code == 404
        assert get(shared, unseen).status_code == 429
        assert get(shared, seen + "x").status_code == 429  # the id of a key seen, not its secret


def test_a_burst_of_bad_keys_at_once_has_at_most_the_limit_verified(freight, monkeypatch):
    """50 requests at once from one address: the five the limit allows reach the key lookup —
    which holds them until all five are there — and the other 45 are refused without one."""
    looked_up = threading.Barrier(5, timeout=30)
    lookups: list[int] = []
    real = freight.store.api_key_get

    def held_lookup(key_id: int) -> Any:
        lookups.append(key_id)
        looked_up.wait()
        return real(key_id)

    monkeypatch.setattr(freight.store, "api_key_get", held_lookup)
    with api(freight) as client:
        attacker = client(ATTACKER)
        with ThreadPoolExecutor(50) as pool:
            statuses = sorted(pool.map(lambda _: get(attacker, BAD).status_code, range(50)))
    assert statuses == [401] * 5 + [429] * 45, statuses
    assert len(lookups) == 5


def test_a_success_takes_back_its_provisional_failure_and_vouches_for_its_key():
    failures = AuthFailures(Limit.parse("3/min"), clock=lambda: 0.0)
    key = ApiKey(7, "k", frozenset({"read"}), Limit.parse("1/s"))
    for _ in range(10):
        failures.end(failures.begin("a", "Bearer obx_7_secret"), key)
    for _ in range(3):
        failures.end(failures.begin("a", BAD), None)
    assert failures.begin("a", BAD).wait == 60
    assert failures.begin("a", "Bearer obx_7_secret").wait is None
    assert failures.begin("a", "Bearer obx_7_other").wait == 60
    assert failures.begin("b", BAD).wait is None
    assert failures.pending() == {"api_auth_refused": 3, "api_auth_throttled": 2}


def test_the_window_ends_and_the_address_may_try_again():
    now = [0.0]
    failures = AuthFailures(Limit.parse("3/min"), clock=lambda: now[0])
    for _ in range(3):
        failures.end(failures.begin("a", BAD), None)
    assert failures.begin("a", BAD).wait == 60
    now[0] = 59.5
    assert failures.begin("a", BAD).wait == 1
    now[0] = 60.0
    assert failures.begin("a", BAD).wait is None


def test_the_table_of_addresses_is_bounded():
    failures = AuthFailures(Limit.parse("5/min"), capacity=100)
    for n in range(10_000):
        failures.end(failures.begin(f"10.{n // 65536}.{n // 256 % 256}.{n % 256}", BAD), None)
    assert failures.addresses() == 100
    assert failures.pending() == {"api_auth_refused": 10_000}


def test_the_limit_is_checked_when_the_api_is_made(freight):
    with pytest.raises(Exception, match="rate limit 'often'"):
        create_api(freight, ApiSettings(auth_failures="often"))


def test_an_ipv6_client_counts_as_its_64_however_it_rotates_its_address(freight):
    """One host holds a whole /64 and picks addresses in it at will: counted per exact address,
    it rotated past the limit (found by review)."""
    from starlette.testclient import TestClient

    app = create_api(freight, ApiSettings(auth_failures="5/min"))
    statuses = []
    for n in range(1, 31):
        with TestClient(app, client=(f"2001:db8::{n:x}", 4000)) as web:
            statuses.append(web.get(JOBS, headers={"Authorization": BAD}).status_code)
    assert statuses == [401] * 5 + [429] * 25, statuses
    with TestClient(app, client=("2001:db8:0:1::1", 4000)) as web:  # another /64: its own count
        assert web.get(JOBS, headers={"Authorization": BAD}).status_code == 401


def test_a_key_the_store_could_not_check_is_not_counted_a_failure(freight, monkeypatch):
    """A store outage is no bad key: the provisional failure goes back, so callers with good
    keys this server has not seen yet are not slowed once the store answers (found by review)."""
    from oncebox.api import guard
    from oncebox.kernel.errors import StoreUnavailable

    good = token(freight, "reader")

    def down(_store: Any, _authorization: str | None) -> None:
        raise StoreUnavailable("the store is away")

    with api(freight) as client:
        caller = client(NEIGHBOUR)
        monkeypatch.setattr(guard, "authenticate", down)
        assert {get(caller, good).status_code for _ in range(8)} == {503}
        monkeypatch.undo()
        assert get(caller, good).status_code == 404  # admitted: the job does not exist

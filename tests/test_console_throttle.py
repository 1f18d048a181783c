"""The login throttle on its own, on a clock the test moves: each (name, address)'s limit, the
name's growing delay and the turn an address that has not failed keeps, the audit's count of
refusals, and a table that stays bounded however many addresses come (issue 44, items 2-3)."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from oncebox.console.throttle import UNKNOWN, LoginLimits, LoginThrottle
from oncebox.kernel.client_address import address_key
from oncebox.kernel.errors import ConfigurationError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fail(throttle: LoginThrottle, name: str, address: str) -> None:
    verdict = throttle.attempt(name, address)
    assert verdict.allowed, verdict


def test_an_address_may_fail_five_times_for_a_name_then_waits_for_the_window():
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    for _ in range(5):
        fail(throttle, "vic", "203.0.113.9")
        clock.now += 10
    refused = throttle.attempt("vic", "203.0.113.9")
    assert (refused.allowed, refused.refused_by, refused.wait_s) == (False, "address", 850)
    assert throttle.attempt("olga", "203.0.113.9").allowed  # another name from there: allowed
    clock.now += 850
    assert throttle.attempt("vic", "203.0.113.9").allowed


def test_an_address_that_has_not_failed_keeps_its_turn_whatever_fails_meanwhile():
    """Failures for vic from ten addresses: the name waits 32 s after its latest. An address
    that has not failed is told its turn; attackers whose own turns come first fail again and
    again, pushing the name's delay out, and it still gets in at the turn it was told."""
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    for i in range(5):
        fail(throttle, "vic", f"203.0.113.{i}")
    vic = throttle.attempt("vic", "198.51.100.7")
    assert (vic.allowed, vic.refused_by, vic.retry_after) == (False, "name", 1.0)
    attackers = [throttle.attempt("vic", f"203.0.113.{i}") for i in range(10, 14)]
    assert all(not a.allowed and a.retry_after == 1.0 for a in attackers)  # the same turn
    clock.now += 1
    for i in range(10, 14):  # the attackers take their turns first; each failure doubles
        fail(throttle, "vic", f"203.0.113.{i}")
    assert throttle.attempt("vic", "203.0.113.99").retry_after == 16.0  # a newcomer waits
    assert throttle.attempt("vic", "198.51.100.7").allowed  # vic's turn was kept


def test_an_address_that_has_failed_waits_the_names_delay_after_its_latest_failure():
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    for i in range(6):
        fail(throttle, "vic", f"203.0.113.{i}")
        clock.now += 1  # each address in turn: the delay is 1 s after the fifth, then 2 s
    refused = throttle.attempt("vic", "203.0.113.0")
    assert (refused.allowed, refused.refused_by, refused.retry_after) == (False, "name", 1.0)
    clock.now += 1
    assert throttle.attempt("vic", "203.0.113.0").allowed


def test_the_names_delay_doubles_up_to_its_maximum_and_passes_with_the_window():
    limits = LoginLimits(name_free=3, name_delay_s=2.0, name_delay_max_s=20.0, window_s=100.0)
    assert [limits.name_delay(n) for n in range(8)] == [0, 0, 0, 2, 4, 8, 16, 20]
    clock = Clock()
    throttle = LoginThrottle(limits, clock=clock)
    waits = []
    for i in range(8):  # each from an address of its own, at the turn it is told
        first = throttle.attempt("vic", f"203.0.113.{i}")
        waits.append(first.retry_after)
        clock.now += first.retry_after
        assert first.allowed or throttle.attempt("vic", f"203.0.113.{i}").allowed
    assert waits == [0, 0, 0, 2, 4, 8, 16, 20]
    clock.now += 100  # the failures leave the window: no delay left
    assert throttle.attempt("vic", "192.0.2.1").allowed


def test_a_right_password_forgives_its_addresss_failures_and_leaves_nothing_behind():
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    for _ in range(4):
        fail(throttle, "vic", "198.51.100.7")  # the user's own typos
    verdict = throttle.attempt("vic", "198.51.100.7")
    assert verdict.allowed and len(throttle) == 2  # counted before the password is verified
    throttle.succeeded(verdict)
    assert len(throttle) == 0


def test_a_refusal_is_audited_once_per_window_standing_for_those_since_the_last():
    clock = Clock()
    throttle = LoginThrottle(LoginLimits(window_s=100.0), clock=clock)
    for _ in range(5):
        fail(throttle, "vic", "203.0.113.9")
    audited = [throttle.attempt("vic", "203.0.113.9").audited for _ in range(30)]
    assert audited == [1] + [0] * 29
    clock.now += 100
    for _ in range(5):
        fail(throttle, "vic", "203.0.113.9")
    assert throttle.attempt("vic", "203.0.113.9").audited == 30  # 29 counted, and itself


def test_ten_thousand_addresses_keep_at_most_max_entries_and_bounded_memory():
    """Unknown names share one bucket; addresses do not, so the table is bounded by count: at
    1 000 entries, 10 000 addresses hold under 600 bytes an entry, and 10 000 more add nothing
    (the table's own size settles after its first evictions)."""
    throttle = LoginThrottle(LoginLimits(max_entries=1_000), clock=Clock())

    def flood(addresses: range) -> int:
        for i in addresses:
            throttle.attempt(UNKNOWN, f"10.{i // 65_536}.{i // 256 % 256}.{i % 256}")
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    gc.collect()
    tracemalloc.start()
    try:
        ten_thousand = flood(range(10_000))
        twenty_thousand = flood(range(10_000, 20_000))
    finally:
        tracemalloc.stop()
    assert len(throttle) == 1_001  # 1 000 (name, address) pairs and the one bucket
    assert ten_thousand < 600 * 1_000, f"{ten_thousand} bytes for 1 000 entries"
    assert twenty_thousand - ten_thousand < 10_000, (ten_thousand, twenty_thousand)


def test_entries_untouched_past_the_window_and_the_longest_delay_are_dropped():
    clock = Clock()
    throttle = LoginThrottle(LoginLimits(window_s=100.0, name_delay_max_s=50.0), clock=clock)
    for i in range(20):
        fail(throttle, UNKNOWN, f"203.0.113.{i}") if i < 5 else throttle.attempt(UNKNOWN, f"x{i}")
    assert len(throttle) == 21
    clock.now += 151
    throttle.attempt("vic", "198.51.100.7")
    assert len(throttle) == 2  # the newcomer's pair and its name


def test_ipv6_addresses_count_per_64_and_ipv4_mapped_ones_as_ipv4():
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::9")
    assert address_key("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert address_key("192.0.2.7") == "192.0.2.7"
    assert address_key("testclient") == "testclient"
    assert address_key("/run/" + "x" * 500) == ("/run/" + "x" * 500)[:64]
    assert address_key(None) == "?"


@pytest.mark.parametrize(
    "bad", [{"per_address": 0}, {"window_s": 0.0}, {"name_delay_max_s": float("inf")}]
)
def test_login_limits_out_of_range_are_a_configuration_error(bad):
    with pytest.raises(ConfigurationError, match="login limits must be positive"):
        LoginLimits(**bad)

"""Console sessions end when idle or old, and an action id is taken once (on a clock the test
moves). The login throttle's tests are in test_console_throttle.py."""

from __future__ import annotations

from oncebox.console.sessions import Sessions


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_ends_after_its_idle_timeout_and_use_keeps_it_alive():
    clock = Clock()
    sessions = Sessions(idle_s=60, lifetime_s=3600, clock=clock)
    kept, idle = sessions.start("olga", "operator"), sessions.start("vic", "viewer")
    for _ in range(3):
        clock.now += 50
        assert sessions.get(kept.id) is kept  # used within the idle timeout: still there
    assert sessions.get(idle.id) is None  # 150 s without use
    clock.now += 61
    assert sessions.get(kept.id) is None


def test_a_session_ends_at_its_lifetime_however_busy():
    clock = Clock()
    sessions = Sessions(idle_s=60, lifetime_s=200, clock=clock)
    session = sessions.start("olga", "operator")
    for _ in range(4):
        clock.now += 50
        assert sessions.get(session.id) is session
    clock.now += 1
    assert sessions.get(session.id) is None


def test_ending_a_session_forgets_it_and_ids_and_tokens_are_unguessable():
    sessions = Sessions()
    first, second = sessions.start("olga", "operator"), sessions.start("olga", "operator")
    assert first.id != second.id and first.csrf != second.csrf and len(first.id) >= 40
    sessions.end(first.id)
    assert sessions.get(first.id) is None and sessions.get(second.id) is second
    assert sessions.get("") is None and sessions.get(None) is None


def test_an_action_id_is_taken_once_and_later_submits_get_its_first_result():
    sessions = Sessions()
    session = sessions.start("olga", "operator")
    assert sessions.claim_action(session, "a1", "/dead") is None
    assert sessions.claim_action(session, "a1", "/elsewhere") == "/dead"  # in flight
    sessions.remember(session, "a1", "/keys/k/1")
    assert sessions.claim_action(session, "a1", "/elsewhere") == "/keys/k/1"

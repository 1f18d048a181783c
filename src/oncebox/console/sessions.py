"""Logged-in sessions and the memory of actions already taken (the login throttle is
`throttle.py`).

Sessions live in the console process's memory: a restart logs everyone out, and a second console
process keeps its own (run one console, or pin clients to one). Each has a random id (the
cookie), a CSRF token for its forms, an idle timeout and an absolute lifetime; logging out or
logging in again ends it. Every action form carries a one-time id; an action already taken under
it answers with its first result instead of acting twice (a double click, a resubmitted form).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from oncebox.console.users import Role
from oncebox.kernel.clock import monotonic

IDLE_S = 30 * 60.0
LIFETIME_S = 12 * 3600.0
ACTIONS_REMEMBERED = 500


@dataclass
class Session:
    id: str
    user: str
    role: Role
    csrf: str
    started: float
    seen: float
    actions: dict[str, str] = field(default_factory=dict)  # action id -> where its result is
    notices: list[tuple[str, str]] = field(default_factory=list)  # (level, text), shown once

    @property
    def may_act(self) -> bool:
        return self.role == "operator"


class Sessions:
    def __init__(
        self,
        *,
        idle_s: float = IDLE_S,
        lifetime_s: float = LIFETIME_S,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self._idle_s, self._lifetime_s, self._clock = idle_s, lifetime_s, clock
        self._by_id: dict[str, Session] = {}
        self._lock = threading.Lock()

    def start(self, user: str, role: Role) -> Session:
        now = self._clock()
        session = Session(
            secrets.token_urlsafe(32), user, role, secrets.token_urlsafe(32), now, now
        )
        with self._lock:
            self._drop_expired(now)
            self._by_id[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id, its idle clock reset; None when unknown or expired."""
        if not session_id:
            return None
        now = self._clock()
        with self._lock:
            session = self._by_id.get(session_id)
            if session is None:
                return None
            if now - session.seen > self._idle_s or now - session.started > self._lifetime_s:
                del self._by_id[session_id]
                return None
            session.seen = now
            return session

    def end(self, session_id: str | None) -> None:
        with self._lock:
            self._by_id.pop(session_id or "", None)

    def claim_action(self, session: Session, action_id: str, meanwhile: str) -> str | None:
        """Reserve `action_id` for a first go (None), or say where its result is when it was
        taken before — or is being taken right now by a concurrent submit (`meanwhile`)."""
        with self._lock:
            if action_id in session.actions:
                return session.actions[action_id]
            if len(session.actions) >= ACTIONS_REMEMBERED:
                session.actions.pop(next(iter(session.actions)))
            session.actions[action_id] = meanwhile
            return None

    def notify(self, session: Session, level: str, text: str) -> None:
        with self._lock:
            session.notices.append((level, text))
            del session.notices[:-10]

    def take_notices(self, session: Session) -> list[tuple[str, str]]:
        with self._lock:
            notices, session.notices = session.notices, []
            return notices

    def remember(self, session: Session, action_id: str, result: str) -> None:
        with self._lock:
            if len(session.actions) >= ACTIONS_REMEMBERED:
                session.actions.pop(next(iter(session.actions)))
            session.actions[action_id] = result

    def _drop_expired(self, now: float) -> None:
        gone = [
            sid
            for sid, s in self._by_id.items()
            if now - s.seen > self._idle_s or now - s.started > self._lifetime_s
        ]
        for sid in gone:
            del self._by_id[sid]

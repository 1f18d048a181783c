"""The login token of a console without users: one at a time, good once, for fifteen minutes.

With no user configured, the console prints a link at start (`…/login#token=…`). The token
travels after `#`, which a browser never sends: no request line, access log, proxy log or
`Referer` holds it; the login page's script (`static/login.js`) posts it with the login form,
and an operator without script pastes it into the form. Exchanged for a session it is spent;
fifteen minutes after it was printed, or once another one was, it is refused. A new one is
printed on the console's terminal when its process gets SIGHUP (`kill -HUP PID`, the PID said at
start), which also kills the one before; a restart prints one too.
"""

from __future__ import annotations

import hmac
import secrets
import threading
from collections.abc import Callable

from oncebox.kernel.clock import monotonic

TOKEN_TTL_S = 15 * 60.0


def login_link(base: str, token: str) -> str:
    """The link printed for an operator: the token in the fragment, never sent to a server."""
    return f"{base}/login#token={token}"


class LoginToken:
    """The console's one live login token; `renew` replaces it, `exchange` spends it."""

    def __init__(
        self, *, ttl_s: float = TOKEN_TTL_S, clock: Callable[[], float] = monotonic
    ) -> None:
        self._ttl_s, self._clock = ttl_s, clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires = 0.0

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    def renew(self) -> str:
        """A fresh token, good once within the time to live; the one before it is dead."""
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._token, self._expires = token, self._clock() + self._ttl_s
        return token

    def exchange(self, offered: str) -> bool:
        """Whether `offered` is the live token; if so it is spent, and no other call, however
        concurrent, gets True for it again."""
        with self._lock:
            live = self._token is not None and self._clock() < self._expires
            if not live or self._token is None:
                self._token = None
                return False
            if not hmac.compare_digest(
                offered.encode("utf-8", "surrogatepass"), self._token.encode()
            ):
                return False
            self._token = None
            return True

"""A warning, once, that requests arrive through a proxy the server was not told to trust.

Without `--forwarded-allow-ips`, uvicorn ignores `X-Forwarded-For` and its kin (as it must: any
client can send them), so behind a reverse proxy every request comes from the proxy's address.
The console's login throttle then counts every user as one address: an attacker's failures stop
everyone's logins for that name, and the audit names the proxy instead of the client. Nothing
at start can tell that a proxy is in front; the first request carrying a forwarding header
can, and says so on stderr, once per process.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from oncebox.kernel.inert import printable

FORWARDING_HEADERS = frozenset(
    {b"forwarded", b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"x-real-ip"}
)


class UntrustedProxyWarning:
    """Wraps the served app when `--forwarded-allow-ips` is not given: the first request with
    a forwarding header calls `warn` with one line naming the proxy's address and the header."""

    def __init__(self, app: ASGIApp, warn: Callable[[str], None]) -> None:
        self.app, self.warn = app, warn
        self.warned = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.warned and scope["type"] in ("http", "websocket"):
            header = next(
                (name for name, _ in scope.get("headers", []) if name in FORWARDING_HEADERS),
                None,
            )
            if header is not None:
                self.warned = True
                client = scope.get("client")
                proxy = printable(str(client[0])) if client else "?"
                self.warn(
                    f"requests arrive through a proxy at {proxy} (they carry "
                    f"{header.decode('latin-1')}) but --forwarded-allow-ips is not set: every "
                    f"client is seen as {proxy}, so what counts per address (the console's login "
                    f"throttle) counts them all as one; if {proxy} is your proxy, start with "
                    f"--forwarded-allow-ips {proxy}"
                )
        await self.app(scope, receive, send)

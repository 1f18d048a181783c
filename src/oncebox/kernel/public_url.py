"""Where a served oncebox (the console, the API, the delivery receiver) is reached, and what it
refuses because of it.

A browser or a caller names the server it wants in the `Host` header, and anyone can write any
name there — including a name of theirs whose DNS points at this server (DNS rebinding), or one a
proxy forwards as it came. So nothing is derived from `Host`: the server knows its public URL
(`--public-url`, or else the bind address), answers only requests that name one of its own hosts
(`HostCheck`, 400 otherwise), builds links and redirects as paths or from the public URL, and
counts a form as its own only when the browser's `Origin` is one of its own origins.

Its own hosts are the public URL's host, the bind address's host, and — when it listens on
loopback or on every address — `localhost`, `127.0.0.1` and `::1`: those names are not anyone's
DNS to repoint. Listening on every address (`0.0.0.0`, `::`) without a public URL, it answers the
loopback names only: any other name a client may use is one it cannot tell from a forged one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.inert import printable

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD = frozenset({"0.0.0.0", "::"})  # noqa: S104 (names of the wildcard bind, compared)
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _shown_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _origin(scheme: str, host: str, port: int) -> str:
    shown = _shown_host(host)
    return f"{scheme}://{shown}" if _DEFAULT_PORTS[scheme] == port else f"{scheme}://{shown}:{port}"


def host_of(header: str) -> str:
    """The host name of a `Host` header's value (`[::1]:8080` -> `::1`), lower-cased."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rpartition(":")[0] if value.count(":") == 1 else value


@dataclass(frozen=True)
class PublicUrl:
    """A served app's public URL and what follows from it.

    `base`: the URL without its trailing slash, the root path included — what links, printed
    lines and the API's examples show. `hosts`: the names a request's `Host` may carry.
    `origins`: the `Origin` values a browser on one of this server's pages sends. `given`:
    said by the operator (`--public-url`), not derived from the bind address."""

    base: str
    origin: str
    path: str
    hosts: frozenset[str]
    origins: frozenset[str]
    given: bool

    @property
    def secure(self) -> bool:
        """Browsers reach it over HTTPS: its cookies are `Secure`."""
        return self.origin.startswith("https://")

    @classmethod
    def of(cls, url: str) -> PublicUrl:
        """The public URL `url` (`https://ops.example/oncebox`) of an app mounted in an app of
        yours: its host and origin alone are its own."""
        scheme, host, port, path = parse(url)
        own = _origin(scheme, host, port)
        return cls(own + path, own, path, frozenset({host}), frozenset({own}), given=True)

    def accepts_host(self, header: str | None) -> bool:
        """The request's `Host` names this server (a request without one does not)."""
        return header is not None and host_of(header) in self.hosts

    def accepts_origin(self, claimed: str) -> bool:
        """`claimed` (an `Origin`, or a `Referer`'s scheme://host:port) is this server's own."""
        return claimed.strip().lower().rstrip("/") in self.origins


def parse(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) of a public URL: http or https, a host, no user, query or
    fragment; the path without its trailing slash ("" for the root). ConfigurationError, in
    one line naming the URL, for anything else."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        parts, port = None, None
    if (
        parts is None
        or parts.scheme not in _DEFAULT_PORTS
        or not parts.hostname
        or parts.username is not None
        or parts.query
        or parts.fragment
        or "\\" in url
        or not printable(url) == url
    ):
        raise ConfigurationError(
            f"public URL {printable(url)[:200]!r}: expected http(s)://HOST[:PORT][/PATH], "
            "e.g. https://ops.example/oncebox"
        )
    path = parts.path.rstrip("/")
    return parts.scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[parts.scheme], path


def for_server(
    public_url: str | None,
    bind_host: str,
    bind_port: int,
    root_path: str,
    also: Sequence[str] = (),
) -> PublicUrl:
    """The public URL of a server bound to `bind_host:bind_port` under `root_path`: the one
    given, or else the bind address's (for a wildcard bind, loopback's). `also`: other URLs it
    is reached by (an internal name beside the public one): their hosts and origins count as
    its own, but links and printed lines show the first."""
    bind = bind_host.lower()
    loopback = bind in LOOPBACK_NAMES or bind.startswith("127.")
    hosts = set(LOOPBACK_NAMES) if loopback or bind in WILDCARD else set()
    if bind not in WILDCARD:
        hosts.add(bind)
    origins = set()
    if public_url is not None:
        scheme, host, port, path = parse(public_url)
        path = path or root_path  # a public URL without a path: the root path follows it
        hosts.add(host)
        own = _origin(scheme, host, port)
    else:
        path = root_path
        own = _origin("http", "127.0.0.1" if bind in WILDCARD else bind, bind_port)
    for other in also:
        scheme, host, port, _ = parse(other)
        hosts.add(host)
        origins.add(_origin(scheme, host, port))
    # a page reached straight at the bind address, under any of its names, is this server's too
    origins |= {own, *(_origin("http", h, bind_port) for h in hosts)}
    return PublicUrl(
        base=own + path,
        origin=own,
        path=path,
        hosts=frozenset(hosts),
        origins=frozenset(origins),
        given=public_url is not None,
    )


class HostCheck:
    """ASGI middleware: a request whose `Host` is not one of `public`'s hosts is answered 400,
    in one line, before any app sees it."""

    def __init__(self, app: Any, public: PublicUrl) -> None:
        self.app = app
        self.public = public

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
        if self.public.accepts_host(host):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        named = "no Host" if host is None else f"Host {printable(host)[:100]!r}"
        text = (
            f"refused: {named} is not this server's name; it answers as {self.public.origin} "
            "(see --public-url)\n"
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(text)).encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": text})

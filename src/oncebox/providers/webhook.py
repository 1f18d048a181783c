"""Webhooks: outbox messages delivered as signed HTTP POSTs, with Standard Webhooks' headers.

    box.channel("hooks", "webhook+https://hooks.acme.example/oncebox?secret_env=ACME_HOOK_SECRET")
    ctx.outbox.add("hooks", {"type": "order.shipped", "order": 42})

The channel's URL names the endpoint (`webhook+https://host[:port]/path`; the query holds this
module's options, so the endpoint takes no query of its own). Each message's payload, a JSON object
of at most 256 KiB, checked when the handler writes it, is the request body: compact JSON, keys
sorted, the same bytes on every attempt. Headers:

    webhook-id          the idempotency key (`oncebox-<token>`, an HMAC of the row's key): the
                        same on every attempt of one message; never the raw key
    webhook-timestamp   when this attempt was signed, in Unix seconds: the host's wall clock
                        (`clock.real_now`), which receivers compare with theirs — not the
                        database's business time, which a test may freeze
    webhook-signature   `v1,<base64 of HMAC-SHA256(secret, "{id}.{timestamp}.{body}")>`

The signing secret comes from the environment — `ONCEBOX_WEBHOOK_SECRET`, or the variable named by
`?secret_env=NAME` — never from the URL, and is never logged. A `whsec_<base64>` secret (the form
Standard Webhooks' libraries use) signs with its decoded bytes, any other with its UTF-8 bytes (16
or more either way). Without a secret the channel pauses: nothing is sent unsigned. A receiver
checks a request with `verify_webhook` (signature compared in constant time, timestamp within a
replay window); it and the signing live in `webhook_signatures.py`, which needs no HTTP client.

Idempotency is what the receivers promise, declared on the channel:
- by default none. The dispatcher marks each row `sending` before its POST, and an unknown outcome
  (a timeout or a lost connection after the request was written, a dispatcher that died mid-send)
  follows the channel's `ambiguity` policy: `hold` (the row is `ambiguous`, for an operator) or
  `retry` (sent again with the same webhook-id, counted as a possible duplicate);
- `?receivers_dedupe=true`: every receiver processes each webhook-id once, forever
  (`&dedupe_hours=H`: for H hours after it first saw it). No marker; an unknown outcome is sent
  again with the same webhook-id, within that window — past it the row is `ambiguous`.

Targets (server-side request forgery):
- `webhook+https://` only, unless the target is allow-listed: then `webhook+http://` too;
- every send resolves the host and checks **every** address it resolves to: loopback, private,
  link-local (169.254.169.254, the cloud metadata service), multicast, reserved, unspecified
  (0.0.0.0, ::), site-local and shared (100.64.0.0/10) addresses are refused, and an IPv4 address
  inside an IPv6 one (IPv4-mapped, 6to4, NAT64) is judged as that IPv4 address. The request then
  goes to the checked address itself, with the Host header and the TLS server name (SNI and the
  certificate check) still the hostname, so a second lookup cannot swap in another address (DNS
  rebinding). Proxies from the environment are not used: one would connect unchecked;
- `?allow=10.0.0.0/8,hooks.internal` lists networks whose addresses may be used and hostnames that
  may resolve anywhere; `webhook+http://` needs the host listed, or every address in a network
  listed;
- redirects are never followed: a 3xx is permanent, and the reason says where it pointed.
A target refused when sending is permanent (dead, the reason naming the host, the address and
why); an IP-literal host is checked when the channel is declared, a ConfigurationError.

Classification (see providers/base.py): 2xx sent (the receipt is a JSON reply's string `id`, else
none); a failed lookup, connection refused or a connect timeout → retryable (nothing was sent); a
timeout or a lost connection after the request was written → ambiguous (above); 408, 425 and 5xx →
retryable, after `Retry-After` if given; 429 → the whole channel pauses until `Retry-After`; 3xx,
410 Gone and every other 4xx → permanent (a 401 or 403 on every message means the receiver and the
channel disagree on the secret). Replies are untrusted: at most 16 KiB is read, counted
decompressed (`providers/replies.py`; a reply cut short still leaves its status, which is what
counts), and what a reason quotes of them is escaped (`inert.printable`). Reasons name the
endpoint as `scheme://host[:port]`, without its path (a path may hold a capability token).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import ssl
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlsplit

import httpx2

from oncebox.kernel import clock
from oncebox.kernel.errors import ConfigurationError, InvalidArguments
from oncebox.kernel.inert import printable, redact
from oncebox.kernel.url_options import FLAGS, number_option
from oncebox.providers.base import (
    Capabilities,
    Outgoing,
    Receipt,
    SendAmbiguous,
    SendPermanent,
    SendRetryable,
    SendThrottled,
)
from oncebox.providers.replies import parse_retry_after, read_reply
from oncebox.providers.webhook_signatures import (
    MAX_WEBHOOK_BYTES,
    WebhookRefused,
    sign_webhook,
    signing_key,
    verify_webhook,
    webhook_body,
)

__all__ = [
    "MAX_WEBHOOK_BYTES",
    "SECRET_ENV",
    "WebhookProvider",
    "WebhookRefused",
    "refusal",
    "sign_webhook",
    "verify_webhook",
    "webhook_body",
]

SECRET_ENV = "ONCEBOX_WEBHOOK_SECRET"  # noqa: S105 (the variable's name, not a secret)
MAX_PORT = 65535
QUOTED_REPLY_CHARS = 300
OPTIONS = frozenset({"secret_env", "timeout", "receivers_dedupe", "dedupe_hours", "allow"})
BOOLEANS = FLAGS
HOSTNAME = re.compile(
    r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*"
)
NAT64 = ipaddress.ip_network("64:ff9b::/96")
METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolve = Callable[[str, int], Sequence[str]]


# -- targets ---------------------------------------------------------------------------------


def refusal(address: Address) -> str | None:
    """Why `address` is no public unicast address ("a loopback address", …), None when it is
    one. An IPv4 address inside an IPv6 one (IPv4-mapped, 6to4, NAT64) is judged as itself."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour
        if inner is None and address in NAT64:
            inner = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if inner is not None:
            why = refusal(inner)
            return f"{inner} inside an IPv6 address, {why}" if why else None
        if address.is_site_local:
            return "a site-local address"
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address" + (" (cloud metadata)" if address in METADATA else "")
    if address.is_multicast:
        return "a multicast address"
    if address.is_private:
        return "a private address"
    if address.is_reserved:
        return "a reserved address"
    if not address.is_global:
        return "a special-purpose address (not globally routable)"
    return None


def _forms(address: Address) -> list[Address]:
    """An address and the IPv4 address inside it, if any (an allow-list of IPv4 networks also
    covers the IPv4-mapped form)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return [address, address.ipv4_mapped]
    return [address]


def _host(text: str) -> str:
    """A hostname in its ASCII form, lowercase, without a trailing dot; or an IP literal."""
    host = text.rstrip(".").lower()
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise ConfigurationError(f"{printable(text)!r} is not a hostname") from None
    if not HOSTNAME.fullmatch(host) or len(host) > 253:
        raise ConfigurationError(f"{printable(text)!r} is not a hostname")
    return host


def _allow_list(text: str) -> tuple[frozenset[str], tuple[Network, ...]]:
    """`?allow=10.0.0.0/8,fd00::/8,hooks.internal`: networks, and hostnames."""
    names: set[str] = set()
    networks: list[Network] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        if "/" in entry or entry.replace(".", "").isdigit() or ":" in entry:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise ConfigurationError(
                    f"allow={printable(entry)!r} is not a network (10.0.0.0/8) or an address"
                ) from None
        else:
            names.add(_host(entry))
    return frozenset(names), tuple(networks)


def _resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to now, in the resolver's order, without repeats."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class _NotConnected(Exception):
    """No connection to one address: nothing was sent to it."""


# -- the provider ----------------------------------------------------------------------------


class WebhookProvider:
    """Posts each message of a channel to one endpoint, signed; see the module docstring.

    `resolve` (host, port → addresses), `verify` (the TLS context) and `now` (the signing clock)
    are seams for tests and for embedding; `from_url` uses the system's."""

    name = "webhook"
    # Its own refusal of a large payload is `check_payload`'s (MAX_WEBHOOK_BYTES of the signed
    # body, as sent); the row's cap stays the one every channel had.
    capabilities = Capabilities(close=True, check_payload=True)

    def __init__(
        self,
        url: str,
        *,
        resolve: Resolve | None = None,
        verify: ssl.SSLContext | None = None,
        now: Callable[[], datetime] = clock.real_now,
    ) -> None:
        parts, shown, self.scheme = _split(url)
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        unknown = sorted(set(options) - OPTIONS)
        if unknown:
            raise ConfigurationError(
                f"webhook URL {shown!r}: unknown option(s) {', '.join(unknown)} (known: "
                f"{', '.join(sorted(OPTIONS))}; the endpoint takes no query of its own)"
            )
        try:
            self.host = _host(parts.hostname or "")
            self.names, self.networks = _allow_list(options.get("allow", ""))
        except ConfigurationError as exc:
            raise ConfigurationError(f"webhook URL {shown!r}: {exc}") from None
        default_port = 443 if self.scheme == "https" else 80
        self.port = _port(parts.netloc, shown) or default_port
        self.path = parts.path or "/"
        bracketed = f"[{self.host}]" if ":" in self.host else self.host
        self.authority = bracketed if self.port == default_port else f"{bracketed}:{self.port}"
        self.where = f"{self.scheme}://{self.authority}"
        if self.scheme == "http" and not (self.names or self.networks):
            raise ConfigurationError(
                f"webhook URL {shown!r}: webhook+http:// is only for an allow-listed target "
                "(?allow=NETWORK or HOST); use webhook+https://"
            )
        literal = _literal(self.host)
        if literal is not None and (problem := self._problem(literal, self.host)):
            raise ConfigurationError(f"webhook URL {shown!r}: {problem}")
        self._secret_env = options.get("secret_env") or SECRET_ENV
        secret = os.environ.get(self._secret_env, "")
        try:
            self._key = signing_key(secret) if secret else None
        except ConfigurationError as exc:
            raise ConfigurationError(f"${self._secret_env}: {exc}") from None
        self.timeout = number_option(options, "timeout", 15.0, low=0.1, high=600, unit="seconds")
        dedupe = BOOLEANS.get(options.get("receivers_dedupe", "false").lower())
        if dedupe is None:
            raise ConfigurationError(
                f"webhook URL {shown!r}: receivers_dedupe must be true or false"
            )
        self.idempotent = dedupe
        self.idempotency_window: timedelta | None = None
        if "dedupe_hours" in options:
            if not dedupe:
                raise ConfigurationError(
                    f"webhook URL {shown!r}: dedupe_hours says how long receivers dedupe; it "
                    "needs receivers_dedupe=true"
                )
            hours = number_option(
                options, "dedupe_hours", 0, low=0.01, high=24 * 3650, unit="hours"
            )
            self.idempotency_window = timedelta(hours=hours)
        self._resolve = resolve or _resolve
        self._now = now
        self._client = httpx2.Client(
            timeout=httpx2.Timeout(self.timeout),
            follow_redirects=False,
            trust_env=False,  # no proxies from the environment: they would connect unchecked
            verify=verify if verify is not None else True,
        )

    def check_payload(self, payload: Mapping[str, Any]) -> None:
        """Refuse, when written, a payload that is no JSON object or is too large."""
        webhook_body(payload)

    # -- where the request may go ------------------------------------------------------------

    def _problem(self, address: Address, shown: str) -> str | None:
        """Why this target may not be reached at `address` (None: it may); `shown` is the
        address as the resolver wrote it."""
        allowed = self.host in self.names or any(
            form in network for form in _forms(address) for network in self.networks
        )
        if allowed:
            return None
        why = refusal(address)
        if why is not None:
            target = f"{self.host} is" if shown == self.host else f"{self.host} is {shown},"
            return f"refused: {target} {why} (allow an internal target with ?allow=NETWORK or HOST)"
        if self.scheme == "http":
            return (
                f"refused: webhook+http:// is only for an allow-listed target, and {self.host} "
                f"is {shown}, not in ?allow="
            )
        return None

    def _addresses(self) -> list[str]:
        """The host's addresses now, each checked; every one must pass (DNS rebinding)."""
        try:
            found = list(self._resolve(self.host, self.port))
        except (OSError, UnicodeError) as exc:
            raise SendRetryable(f"{self.where}: cannot resolve {self.host} ({exc})") from None
        if not found:
            raise SendRetryable(f"{self.where}: {self.host} resolves to no address")
        addresses: list[str] = []
        for text in found:
            try:
                address = ipaddress.ip_address(text.partition("%")[0])
            except ValueError:
                raise SendPermanent(
                    f"{self.where}: refused: {self.host} resolves to {printable(text)!r}, "
                    "not an IP address"
                ) from None
            problem = self._problem(address, printable(text))
            if problem is not None:
                raise SendPermanent(f"{self.where}: {problem}")
            addresses.append(text)
        return addresses

    # -- one send ----------------------------------------------------------------------------

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        try:
            body = webhook_body(outgoing.payload)
        except InvalidArguments as exc:
            raise SendPermanent(f"the message cannot be sent as a webhook: {exc}") from None
        if self._key is None:
            raise SendThrottled(
                f"{self.where}: no signing secret in ${self._secret_env}; nothing is sent unsigned"
            )
        addresses = self._addresses()
        stamp = str(int(self._now().timestamp()))
        headers = {
            "Host": self.authority,
            "Content-Type": "application/json",
            "Accept-Encoding": "identity",  # replies are small; a compressed one is capped too
            "User-Agent": "oncebox-webhook",
            "webhook-id": idempotency_key,
            "webhook-timestamp": stamp,
            "webhook-signature": sign_webhook(self._key, idempotency_key, stamp, body),
        }
        failures: list[str] = []
        for address in addresses:
            try:
                return self._post(address, headers, body)
            except _NotConnected as exc:  # nothing sent to it: the next address may answer
                failures.append(str(exc))
        raise SendRetryable(f"{self.where}: not sent ({'; '.join(failures)})")

    def _post(self, address: str, headers: dict[str, str], body: bytes) -> Receipt:
        """POST to `address` itself, as the hostname (Host header, TLS SNI and certificate)."""
        pinned = f"[{address}]" if ":" in address else address
        url = f"{self.scheme}://{pinned}:{self.port}{self.path}"
        try:
            with self._client.stream(
                "POST", url, content=body, headers=headers, extensions={"sni_hostname": self.host}
            ) as response:
                return self._classify(response, _reply(response))
        except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as exc:
            raise _NotConnected(f"{address}: {type(exc).__name__}: {exc}") from None
        except httpx2.TransportError as exc:
            raise SendAmbiguous(
                f"{self.where}: {type(exc).__name__} after the request was sent to {address} "
                f"({exc}); it may have been received"
            ) from None

    def _classify(self, response: httpx2.Response, reply: bytes) -> Receipt:
        status = response.status_code
        quoted = printable(reply[:QUOTED_REPLY_CHARS].decode("utf-8", "replace"))
        reason = f"{self.where}: HTTP {status} {quoted}".strip()
        if 200 <= status < 300:
            return Receipt(_reply_id(reply), f"HTTP {status}")
        if 300 <= status < 400:
            location = printable(response.headers.get("location", "")[:200]) or "nowhere"
            raise SendPermanent(
                f"{self.where}: HTTP {status} redirect to {location} not followed (webhooks "
                "are never redirected: declare the channel with the final URL)"
            )
        if status == 429:
            wait = parse_retry_after(
                response.headers.get("retry-after"), response.headers.get("date")
            )
            raise SendThrottled(reason, wait)
        if status in (408, 425) or status >= 500:
            raise SendRetryable(reason, parse_retry_after(response.headers.get("retry-after")))
        if status == 410:
            raise SendPermanent(f"{reason} (the receiver says the endpoint is gone)")
        if status in (401, 403):
            raise SendPermanent(
                f"{reason} (refused by the receiver; on every message: check the signing secret)"
            )
        raise SendPermanent(reason)

    def close(self) -> None:
        self._client.close()


def _split(url: str) -> tuple[SplitResult, str, str]:
    """The URL's parts, the URL as errors show it (no path or query: they may hold secrets) and
    its scheme (https or http); a ConfigurationError for what is no webhook URL at all."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed '['
        raise ConfigurationError(f"webhook URL {redact(url)[:80]!r} is malformed: {exc}") from None
    shown = redact(f"{parts.scheme}://{parts.netloc}")
    scheme = parts.scheme.lower().removeprefix("webhook+")
    if scheme not in ("https", "http") or not parts.scheme.lower().startswith("webhook+"):
        raise ConfigurationError(
            f"webhook URL {shown!r}: use webhook+https://host/path (webhook+http:// only for "
            "an allow-listed target)"
        )
    if parts.username is not None or parts.password is not None:
        raise ConfigurationError(
            f"webhook URL {shown!r}: no credentials in the URL; the signing secret comes "
            "from the environment (?secret_env=NAME)"
        )
    if not parts.hostname:
        raise ConfigurationError(f"webhook URL {shown!r} names no host")
    return parts, shown, scheme


def _port(netloc: str, shown: str) -> int | None:
    """The URL's port (None: none given, or empty), 1-65535; anything else a ConfigurationError,
    not urlsplit's bare ValueError (and not port 0 read as "none given")."""
    authority = netloc.rpartition("@")[2]
    text = authority.rpartition("]")[2] if authority.startswith("[") else authority
    port = text.rpartition(":")[2] if ":" in text else ""
    if not port:  # RFC 3986: an empty port is the scheme's
        return None
    if port.isascii() and port.isdigit() and 0 < int(port) <= MAX_PORT:
        return int(port)
    said = port if port.isascii() and port.isdigit() and len(port) <= 12 else repr(port[:20])
    raise ConfigurationError(f"webhook URL {shown!r}: port {said} is not a port (1-65535)")


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _reply(response: httpx2.Response) -> bytes:
    """What is read of the reply (`read_reply`: at most 16 KiB, decoded); a reply cut short
    still leaves its status, which is what counts."""
    try:
        return read_reply(response).body
    except (httpx2.HTTPError, httpx2.StreamError):
        return b""


def _reply_id(reply: bytes) -> str | None:
    """A JSON reply's string `id`, escaped and capped: what the receipt records."""
    try:
        parsed = json.loads(reply)
    except (ValueError, RecursionError):
        return None
    if isinstance(parsed, dict) and isinstance(parsed.get("id"), str) and parsed["id"]:
        return printable(parsed["id"][:200])
    return None

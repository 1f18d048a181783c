"""API keys: who may call the HTTP API, for what, how often.

A key is `obx_<id>_<secret>`: the id finds its row, the secret (256 random bits, shown once when
the key is made) proves it. The store keeps the secret's SHA-256 only — a slow password hash buys
nothing against a secret nobody can guess — and the digests are compared in constant time; an
unknown id costs the same comparison. A revoked key is refused from the next request on, by
every server (each request reads the key's row: a primary-key read).

Scopes follow the console's roles: `read` is what a viewer may see (jobs, a key's receipts,
periods, the API's own description), `operate` what an operator may do (replay a dead letter,
fire a schedule; it includes `read`), and `enqueue` — which the console has no use for — adds
jobs. A key holds any set of them; every key may read the API's description.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from oncebox.kernel.errors import ConfigurationError, NotFound
from oncebox.limits.rates import Limit
from oncebox.store.protocol import Store
from oncebox.store.records import ApiKeyRow

Scope = Literal["enqueue", "read", "operate"]
SCOPES: tuple[Scope, ...] = ("enqueue", "read", "operate")
IMPLIED: dict[Scope, frozenset[Scope]] = {"operate": frozenset({"read"})}
DEFAULT_RATE = "50/s"
PREFIX = "obx"
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_ID_RE = re.compile(r"[0-9]{1,18}")  # ASCII digits only: str.isdigit() admits '²', int() not
_DUMMY = hashlib.sha256(b"oncebox-api-no-such-key").hexdigest()


@dataclass(frozen=True)
class ApiKey:
    """A live key as a request holds it."""

    id: int
    name: str
    scopes: frozenset[Scope]
    rate: Limit

    def may(self, scope: Scope) -> bool:
        return scope in self.scopes or any(scope in IMPLIED.get(s, ()) for s in self.scopes)


@dataclass(frozen=True)
class IssuedKey:
    """A key just made: `token` is shown once and never stored."""

    row: ApiKeyRow
    token: str


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_scopes(values: Iterable[str]) -> frozenset[Scope]:
    chosen: set[Scope] = set()
    for value in values:
        for part in value.replace(",", " ").split():
            if part not in SCOPES:
                raise ConfigurationError(f"scope {part!r} is not one of {', '.join(SCOPES)}")
            chosen.add(next(s for s in SCOPES if s == part))
    if not chosen:
        raise ConfigurationError(f"an API key needs at least one scope ({', '.join(SCOPES)})")
    return frozenset(chosen)


def issue_key(
    store: Store, name: str, scopes: Iterable[str], *, rate: str = DEFAULT_RATE, by: str
) -> IssuedKey:
    """Make a key; the name is lowercase letters, digits and `.-_`, unique for ever."""
    if not _NAME_RE.fullmatch(name):
        raise ConfigurationError(
            f"API key name {name[:80]!r} must be 1-64 of a-z, 0-9, '.', '_', '-' "
            "(starting with a letter or digit)"
        )
    chosen = parse_scopes(scopes)
    Limit.parse(rate)
    secret = secrets.token_urlsafe(32)
    text = " ".join(s for s in SCOPES if s in chosen)
    row = store.api_key_insert(name, text, digest(secret), rate, by)
    if row is None:
        raise ConfigurationError(f"an API key named {name!r} exists (revoked keys keep names)")
    return IssuedKey(row, f"{PREFIX}_{row.id}_{secret}")


def revoke_key(store: Store, name: str) -> ApiKeyRow:
    row = store.api_key_revoke(name)
    if row is None:
        raise NotFound(f"no API key named {name[:80]!r}")
    return row


def live_key(row: ApiKeyRow) -> ApiKey:
    scopes = frozenset(s for s in SCOPES if s in row.scopes.split())
    return ApiKey(row.id, row.name, scopes, Limit.parse(row.rate))


def parse_token(authorization: str | None) -> tuple[int, str] | None:
    """The key id and secret an `Authorization: Bearer obx_<id>_<secret>` header holds; None
    for no header or a malformed one."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    prefix, _, rest = token.strip().partition("_")
    key_id, _, secret = rest.partition("_")
    if scheme.lower() != "bearer" or prefix != PREFIX or not _ID_RE.fullmatch(key_id) or not secret:
        return None
    return int(key_id), secret


def authenticate(store: Store, authorization: str | None) -> ApiKey | None:
    """The live key an `Authorization: Bearer obx_<id>_<secret>` header names; None for no
    header, a malformed one, an unknown or revoked key, or a wrong secret."""
    parsed = parse_token(authorization)
    if parsed is None:
        return None
    key_id, secret = parsed
    row = store.api_key_get(key_id)
    expected = _DUMMY if row is None else row.secret_sha256
    matches = hmac.compare_digest(digest(secret).encode(), expected.encode())
    if row is None or not matches or row.revoked_at is not None:
        return None
    return live_key(row)

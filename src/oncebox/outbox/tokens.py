"""What leaves the system in place of a business key.

A key may expose internal ids (`weekly-digest/customer-42/…`), so nothing sent to a provider or a
recipient carries it. Each outbox row gets a *token*: an HMAC-SHA256 of its key under the box's
secret (`ONCEBOX_SECRET`). The token is computed once, when the row is written, and stored with it
— so every attempt of one key, from any worker, before or after a secret rotation, sends the same
`Message-ID`, `X-Oncebox-Token` and provider idempotency key.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets

from oncebox.kernel.errors import ConfigurationError
from oncebox.store.protocol import Store

log = logging.getLogger("oncebox")

SECRET_ENV = "ONCEBOX_SECRET"  # noqa: S105 (the variable's name, not a secret)
SECRET_SETTING = "secret"  # noqa: S105 (a settings row name)
MIN_SECRET_CHARS = 16


def derive_token(secret: str, key: str) -> str:
    """128 bits of HMAC-SHA256(secret, key), hex: unguessable without the secret, stable."""
    # one call into OpenSSL (`hmac.new` builds and copies hash objects in Python: 2 µs a row)
    return hmac.digest(secret.encode("utf-8"), key.encode("utf-8"), "sha256").hex()[:32]


def idempotency_key(token: str) -> str:
    """The provider idempotency key: short (≤ 255, SparkPost's `[A-Za-z0-9._-]`), no raw key."""
    return f"oncebox-{token}"


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def check_secret(secret: str, where: str) -> str:
    if len(secret) < MIN_SECRET_CHARS:
        raise ConfigurationError(
            f"the HMAC secret from {where} is {len(secret)} characters; use at least "
            f"{MIN_SECRET_CHARS} random characters"
        )
    return secret


def secret_from_env() -> str | None:
    value = os.environ.get(SECRET_ENV)
    return check_secret(value, SECRET_ENV) if value else None


class SecretSource:
    """Where a process's HMAC secret comes from, in order: the one given in code
    (`Box(secret=...)`), `ONCEBOX_SECRET`, or one stored in the database — which every process
    without the variable then shares, so all workers of one database derive the same tokens."""

    def __init__(self, store: Store, where: str, explicit: str | None = None) -> None:
        self.store = store
        self.where = where  # the database, as it may be shown (no password)
        self._secret = check_secret(explicit, "Box(secret=...)") if explicit else None

    def get(self) -> str:
        if self._secret is None:
            self._secret = secret_from_env() or self.store.setting_get(SECRET_SETTING)
        if self._secret is None:
            raise ConfigurationError(
                "no HMAC secret for outbox tokens: set ONCEBOX_SECRET (16+ random characters) "
                "on every worker, or store one in the database with box.init_secret()"
            )
        return self._secret

    def ensure(self) -> str:
        """The secret; when none is configured anywhere, a random one stored in the database.
        Workers call this at start, so a missing secret never turns into a dead letter per
        message."""
        try:
            return self.get()
        except ConfigurationError:
            stored = self.init()
            log.info("stored a new HMAC secret for outbox tokens in %s", self.where)
            return stored

    def init(self) -> str:
        """Store a random secret in the database unless one is there (every worker then
        agrees); an explicit or environment secret still wins."""
        stored = self.store.setting_put_if_absent(SECRET_SETTING, new_secret())
        self._secret = self._secret or secret_from_env() or stored
        return self._secret

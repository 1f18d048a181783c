"""Who may use the console, and as what: users with scrypt-hashed passwords, in two roles.

`operator` may act (replay, discard, resolve); `viewer` may only look. The same two roles are
meant for the HTTP API's keys. Users come from `ONCEBOX_CONSOLE_USERS` or a file, one per line:
`name role scrypt$...` (`oncebox console hash-password` prints the hash). With none configured
the console makes a one-time token at start and prints a login link with it
(`console.login_token`): nothing is ever served without a login.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Literal

from oncebox.kernel.errors import ConfigurationError

Role = Literal["operator", "viewer"]
ROLES: tuple[Role, ...] = ("operator", "viewer")
# scrypt's cost: 2^15 x 8 x 1 takes ~50 ms and 32 MiB here, per login attempt, which is the point
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**15, 8, 1
_MAX_MEM = 64 * 1024 * 1024
MAX_NAME_CHARS = 64  # a user's name; a login with a longer one is refused before anything else
# a login as someone unknown still pays for a hash, so a name's existence does not show in timing
_DUMMY_SALT = b"oncebox-console-no-such-user"


@dataclass(frozen=True)
class User:
    name: str
    role: Role
    password_hash: str

    @property
    def may_act(self) -> bool:
        return self.role == "operator"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=_MAX_MEM, dklen=32)


def hash_password(password: str) -> str:
    """`scrypt$N$r$p$salt$hash`, the form the users file and variable hold."""
    if not password:
        raise ConfigurationError("a console password cannot be empty")
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def _parsed_hash(text: str) -> tuple[int, int, int, bytes, bytes]:
    parts = text.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ConfigurationError("a console password hash is scrypt$N$r$p$salt$hash")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, digest = _unb64(parts[4]), _unb64(parts[5])
    except ValueError:
        raise ConfigurationError("a console password hash is scrypt$N$r$p$salt$hash") from None
    if n < 2**14 or n & (n - 1) or not 1 <= r <= 32 or not 1 <= p <= 16 or len(digest) != 32:
        raise ConfigurationError("a console password hash has parameters out of range")
    return n, r, p, salt, digest


def verify_password(user: User | None, password: str) -> bool:
    """Whether `password` is `user`'s, in constant time; an unknown user costs as much."""
    if user is None:
        _scrypt(password, _DUMMY_SALT, SCRYPT_N, SCRYPT_R, SCRYPT_P)
        return False
    n, r, p, salt, digest = _parsed_hash(user.password_hash)
    return hmac.compare_digest(_scrypt(password, salt, n, r, p), digest)


def parse_users(text: str, where: str) -> dict[str, User]:
    """Users from lines `name role hash` (or `name:role:hash`, `;`-separated, as one
    environment variable holds them); blank lines and `#` comments are skipped. Any mistake is
    a ConfigurationError naming the line."""
    users: dict[str, User] = {}
    entries = text.replace(";", "\n").splitlines()
    for number, raw in enumerate(entries, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(":") if " " not in line and line.count(":") == 2 else line.split()
        if len(fields) != 3:
            raise ConfigurationError(f"{where}, entry {number}: expected `name role hash`")
        name, role, password_hash = fields
        if role not in ROLES:
            raise ConfigurationError(
                f"{where}, entry {number}: the role is operator or viewer, not {role!r}"
            )
        if not name.isprintable() or len(name) > MAX_NAME_CHARS:
            raise ConfigurationError(f"{where}, entry {number}: a user name of printable text")
        try:
            _parsed_hash(password_hash)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}, entry {number}: {exc}") from None
        if name in users:
            raise ConfigurationError(f"{where}, entry {number}: {name!r} is listed twice")
        users[name] = User(name, "operator" if role == "operator" else "viewer", password_hash)
    return users

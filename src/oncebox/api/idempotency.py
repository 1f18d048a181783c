"""`Idempotency-Key` as the IETF draft (draft-ietf-httpapi-idempotency-key-header) has it, per
API key: the first request with a key is answered and its answer kept for `RETAIN`; a retry with
the same key and the same request gets that answer again (`Idempotent-Replayed: true`), whether
or not the first one's answer reached the caller; the same key with another request is refused
(422), and so is a retry while the first is still being answered (409, `Retry-After`). An answer
a retry may change — a 404 or a 409, "not yet" or "not now" — is not kept either.

The request is its method, path and body bytes (the fingerprint); the key is the caller's
(1-255 printable characters; a structured-field string's quotes are taken off). An answer of 5xx
is not kept — the server failed, nothing was decided — so a retry runs again.

The key stays with its holder while the holder is at work, however long that takes: the claim
holds it for `HOLD`, and the holder renews that every `RENEW_EVERY` while its request runs
(`kept`), so a retry meanwhile is told 409. A holder that dies mid-request stops renewing; a
retry of the same request takes the key over once the hold has run out — in the claim's own
statement, on the row it locks, so of two retries one takes it. A holder taken over (it could
not renew for `HOLD`: a store outage, a stalled process) records nothing: its answer and its
renewals are fenced on its claim. Running a request again is safe however it happens: what it
writes is keyed (a job's business key, a period's run), so the Idempotency-Key saves a second
answer, never a second job.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from oncebox.api.problems import Problem
from oncebox.store.protocol import Store
from oncebox.store.records import ApiRequestClaim

log = logging.getLogger("oncebox.api")
RETAIN = timedelta(hours=24)
HOLD = timedelta(seconds=30)  # a holder that stops renewing loses the key after this
RENEW_EVERY = HOLD / 3  # so a renewal or two may fail (the store away a moment) and it keeps it
HEADER = "idempotency-key"
UNSETTLED = frozenset({404, 409})  # answers a retry may change: never replayed
_TRIES = 3


@dataclass(frozen=True)
class Held:
    """This request holds the key: answer, then `finish` (or `release` on a 5xx)."""

    key_id: int
    idempotency_key: str
    claim: str


@dataclass(frozen=True)
class Replay:
    """The first answer to this request, to send again: its status, body and headers."""

    status: int
    body: str
    headers: dict[str, str]


def header_value(raw: str | None) -> str | None:
    """The key from the header (None: no header); a malformed one is a 400 problem."""
    if raw is None:
        return None
    value = raw.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    if not 1 <= len(value) <= 255 or not all(" " <= ch <= "~" for ch in value):
        raise Problem(
            400,
            "malformed-request",
            "the Idempotency-Key header must be 1-255 printable ASCII characters",
        )
    return value


def fingerprint(method: str, path: str, body: bytes) -> str:
    digest = hashlib.sha256()
    for part in (method.encode(), path.encode(), body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def begin(
    store: Store, key_id: int, idempotency_key: str, request: str, *, retain: timedelta = RETAIN
) -> Held | Replay:
    """Hold `idempotency_key` for this request, or say what to answer instead. (`retain`: the
    simulation keeps its records minutes, so that its worlds see them expire and pruned.)"""
    claim = secrets.token_hex(16)
    for _ in range(_TRIES):
        held = store.api_request_claim(
            ApiRequestClaim(key_id, idempotency_key, request, claim, retain, HOLD)
        )
        if held is not None:
            return Held(key_id, idempotency_key, claim)
        found = store.api_request_get(key_id, idempotency_key)
        if found is None:  # released or expired since the claim was refused: claim again
            continue
        if found.fingerprint != request:
            raise Problem(
                422,
                "idempotency-key-reused",
                "this Idempotency-Key was first used with another method, path or body; "
                "use a new key for a new request",
            )
        if found.status is None or found.response is None:
            break
        kept = json.loads(found.response)
        return Replay(found.status, kept["body"], kept["headers"])
    raise Problem(
        409,
        "idempotency-key-in-flight",
        "a request with this Idempotency-Key is still being answered; retry after it",
        headers={"Retry-After": "1"},
    )


@contextmanager
def kept(store: Store, held: Held | None) -> Iterator[None]:
    """`held` renewed while the block runs — the request answering under it is at work — from
    a thread of its own; the renewals have stopped when the block ends."""
    if held is None:
        yield
        return
    stop = threading.Event()
    beat = threading.Thread(
        target=_renew, args=(store, held, stop), name="api-idempotency-hold", daemon=True
    )
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()


def _renew(store: Store, held: Held, stop: threading.Event) -> None:
    while not stop.wait(RENEW_EVERY.total_seconds()):
        try:
            renewed = store.api_request_renew(held.key_id, held.idempotency_key, held.claim, HOLD)
        except Exception:  # the store away: the next beat tries again, within the hold
            log.warning("renewing an Idempotency-Key's hold failed", exc_info=True)
            continue
        if not renewed:  # taken over after a hold that ran out: this answer will not be kept
            log.warning(
                "an Idempotency-Key was taken over from a request still at work (it could not "
                "renew its hold for %s s); its answer will not be kept",
                int(HOLD.total_seconds()),
            )
            return


def finish(store: Store, held: Held, status: int, body: str, headers: dict[str, str]) -> None:
    """Keep the answer for a retry — unless it is one a retry may change: a 5xx (the server
    failed), a 409 (a paused schedule, a period still fanning out, a row not dead yet) or a 404
    (a task or schedule a deploy is about to bring): the key is let go and a retry runs."""
    if status >= 500 or status in UNSETTLED:
        store.api_request_release(held.key_id, held.idempotency_key, held.claim)
        return
    kept = json.dumps({"body": body, "headers": headers})
    store.api_request_finish(held.key_id, held.idempotency_key, held.claim, status, kept)

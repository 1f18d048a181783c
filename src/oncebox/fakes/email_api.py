"""`FakeEmailApi`: an idempotent HTTP email API on loopback; see the package docstring.

Modelled on Resend: `POST /emails` with `Idempotency-Key`; the first response per key is stored
and replayed (`Idempotency-Replayed: true`) for the window (`window=`, 24 hours by default, on the
real clock: it is the outside world's memory, not the database's); past it the key is forgotten
and a resend is delivered again — a duplicate, as with the real API. A key whose request is in
flight gets `409 concurrent_idempotent_requests`; a key reused with a different body gets
`409 invalid_idempotent_request`. Scripted actions apply to the next requests, in order:

    "ok"                    accept (the default)
    "500", "503", "400", "422", "408"   that status, nothing delivered ("503:120": with
                                        Retry-After: 120)
    "429:SECONDS" / "429:date:SECONDS"  throttle, Retry-After in seconds / as an HTTP-date
    "accept-then-timeout:SECONDS"       deliver, then answer only after SECONDS (past the client
                                        timeout: the client does not know it was accepted)
    "accept-then-reset"                 deliver, then close the connection without answering
    "reset"                             close the connection at once (nothing delivered; the
                                        client cannot tell)
    "409-in-progress" / "409-mismatch"  answer as if the key were in flight / reused with
                                        another body (for deterministic classification tests)
    "lookup-500", "lookup-404", …       a lookup (GET) answers that status
    "lookup-reset"                      a lookup's connection is closed without an answer

`lookup-` actions are taken by lookups only and the others by sends only, each kind the first
of its kind in the script (a send never eats a lookup's action, nor a lookup a send's).

Lookups, as Resend's retrieve-email: `GET /emails/{id}` answers 200 `{"object": "email", "id",
"to", "from", "subject", "created_at", "last_event", "tags", …}` for a delivered id, else 404
`{"name": "not_found"}`. `GET /emails?message_id=<Message-ID>` answers 200 `{"object": "list",
"data": [...]}` with the messages sent with that `Message-ID` header (angle brackets optional) —
the search by our own id that some providers offer (Mailgun's events, Postmark's outbound
search), so a client that lost an answer can find what it sent. `last_event` is the latest
webhook event to have happened (`provider_webhooks`), "delivered" without webhooks.

Webhooks: `send_webhooks(url, secret, ...)` makes every later delivered message (not a replay)
emit Resend's delivery events to `url`, Svix-signed; see `oncebox.fakes.provider_webhooks`.
`wait_webhooks(timeout)` waits for them to settle, `webhook_log` lists every attempt.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from oncebox.fakes.loopback import LoopbackServer
from oncebox.fakes.provider_webhooks import (
    WebhookAttempt,
    WebhookEmitter,
    email_object,
    header_value,
    tag_list,
)
from oncebox.kernel import clock


@dataclass(frozen=True)
class Delivered:
    idempotency_key: str | None
    token: str | None
    body: dict[str, Any]
    message_id: str
    at: float = 0.0  # when it arrived, on the real monotonic clock (rate checks)
    created_at: datetime | None = None  # when it arrived, on the wall clock (lookups, webhooks)


@dataclass
class _Stored:
    body_hash: str
    stored_at: float
    status: int = 0
    response: bytes = b""
    done: threading.Event = field(default_factory=threading.Event)


class FakeEmailApi(LoopbackServer):
    def __init__(
        self,
        host: str = "127.0.0.1",
        *,
        window: timedelta = timedelta(hours=24),
        now: Callable[[], float] = clock.monotonic,
    ) -> None:
        self.window = window
        self.now = now  # the clock its window is counted on (the chaos harness sets its own)
        self.delivered: list[Delivered] = []
        self.requests = 0
        self._script: deque[str] = deque()
        self._keys: dict[str, _Stored] = {}
        self._lock = threading.Lock()
        self._emitter: WebhookEmitter | None = None
        self._listen(type("Handler", (_Handler,), {"api": self}), host)

    @property
    def url(self) -> str:
        return f"resend+http://{self.host}:{self.port}"

    def script(self, *actions: str) -> None:
        with self._lock:
            self._script.extend(actions)

    def next_action(self, *, lookup: bool = False) -> str:
        """The first scripted action of this kind of request (`lookup-` ones for a GET, the
        others for a POST), or "ok". Only sends count in `requests`."""
        with self._lock:
            if not lookup:
                self.requests += 1
            for index, action in enumerate(self._script):
                if action.startswith("lookup-") == lookup:
                    del self._script[index]
                    return action
            return "ok"

    def send_webhooks(self, url: str, secret: str, **options: Any) -> WebhookEmitter:
        """From now on, send each delivered message's events to `url` (replacing, and stopping,
        any earlier emitter); `options` are `WebhookEmitter`'s (delay, duplicates, reorder,
        bad_signature_every, outcomes, timeout, attempts, backoff)."""
        emitter = WebhookEmitter(url, secret, **options)
        with self._lock:
            earlier, self._emitter = self._emitter, emitter
        if earlier is not None:
            earlier.stop()
        return emitter

    def emit_raw(
        self,
        event_type: str,
        data: dict[str, Any],
        *,
        stale: bool = False,
        forged: bool = False,
        svix_id: str | None = None,
    ) -> str:
        """One event of any type through the configured emitter (`WebhookEmitter.emit_raw`)."""
        return self._webhooks().emit_raw(
            event_type, data, stale=stale, forged=forged, svix_id=svix_id
        )

    def wait_webhooks(self, timeout: float = 10.0) -> bool:
        """Whether every event emitted so far was answered 2xx or given up within `timeout`."""
        with self._lock:
            emitter = self._emitter
        return True if emitter is None else emitter.wait(timeout)

    @property
    def webhook_log(self) -> list[WebhookAttempt]:
        """Every webhook attempt so far: (svix_id, type, status or error, signed_ok)."""
        with self._lock:
            emitter = self._emitter
        return [] if emitter is None else list(emitter.log)

    def last_event(self, message_id: str) -> str:
        with self._lock:
            emitter = self._emitter
        found = emitter.last_event(message_id) if emitter is not None else None
        return found or "delivered"

    def _webhooks(self) -> WebhookEmitter:
        with self._lock:
            if self._emitter is None:
                raise RuntimeError("call send_webhooks(url, secret) first")
            return self._emitter

    def _deliver(self, key: str | None, body: dict[str, Any]) -> str:
        """Record one delivered message (a new one, never a replay) and emit its webhooks."""
        token = header_value(body, "X-Oncebox-Token")
        if token is None:
            token = next((t["value"] for t in tag_list(body) if t["name"] == "oncebox"), None)
        created_at = clock.real_now()
        with self._lock:
            message_id = f"fake-{len(self.delivered) + 1}"
            self.delivered.append(
                Delivered(key, token, body, message_id, clock.monotonic(), created_at)
            )
            emitter = self._emitter
        if emitter is not None:
            emitter.emit_email(message_id, body, created_at)
        return message_id

    def lookup(self, message_id: str) -> dict[str, Any] | None:
        """`GET /emails/{id}`'s object, or None for an id never delivered."""
        with self._lock:
            found = next((d for d in self.delivered if d.message_id == message_id), None)
        if found is None:
            return None
        return self._object(found)

    def search(self, message_header: str) -> list[dict[str, Any]]:
        """The messages sent with this Message-ID header, newest first."""
        wanted = message_header.strip().strip("<>")
        with self._lock:
            sent = list(self.delivered)
        return [
            self._object(d)
            for d in reversed(sent)
            if (header_value(d.body, "Message-ID") or "").strip().strip("<>") == wanted
        ]

    def _object(self, delivered: Delivered) -> dict[str, Any]:
        created_at = delivered.created_at or clock.real_now()
        last = self.last_event(delivered.message_id)
        return email_object(delivered.message_id, delivered.body, created_at, last)

    def _remembered(self, key: str) -> _Stored | None:
        """The stored request of a key, unless the window has passed since it was first stored
        (then it is forgotten). Called with the lock held."""
        stored = self._keys.get(key)
        if (
            stored is not None
            and stored.done.is_set()
            and self.now() - stored.stored_at >= self.window.total_seconds()
        ):
            del self._keys[key]
            return None
        return stored

    def tokens(self) -> list[str | None]:
        with self._lock:
            return [d.token for d in self.delivered]

    def stop(self) -> None:
        """Stop serving, and stop the webhook emitter's thread (queued events are dropped)."""
        with self._lock:
            emitter = self._emitter
        if emitter is not None:
            emitter.stop()
        super().stop()


class _Handler(BaseHTTPRequestHandler):
    api: FakeEmailApi
    protocol_version = "HTTP/1.1"
    # headers and body leave in separate writes: without this, Nagle and the client's delayed
    # ACK add ~40 ms to every keep-alive response
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read `delivered`, not stderr."""

    def _reply(
        self,
        status: int,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        replayed: bool = False,
    ) -> bytes:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if replayed:
            self.send_header("Idempotency-Replayed", "true")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)
        return payload

    def do_GET(self) -> None:
        api = self.api
        split = urlsplit(self.path)
        kind, _, _ = api.next_action(lookup=True).removeprefix("lookup-").partition(":")
        if kind == "reset":
            self._reset()
            return
        if kind.isdigit() and kind != "200":
            self._reply(int(kind), {"name": "scripted_failure", "statusCode": int(kind)})
            return
        if split.path == "/emails":
            wanted = parse_qs(split.query).get("message_id")
            if not wanted:
                problem = "this fake lists emails by message_id only"
                self._reply(
                    422, {"statusCode": 422, "name": "validation_error", "message": problem}
                )
                return
            self._reply(200, {"object": "list", "data": api.search(wanted[0])})
            return
        prefix, _, message_id = split.path.rpartition("/")
        found = api.lookup(message_id) if prefix == "/emails" else None
        if found is None:
            self._reply(404, {"statusCode": 404, "name": "not_found", "message": "Email not found"})
            return
        self._reply(200, found)

    def do_POST(self) -> None:
        api = self.api
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/emails":
            self._reply(404, {"name": "not_found"})
            return
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            self._reply(422, {"name": "validation_error", "message": "body is not JSON"})
            return
        key = self.headers.get("Idempotency-Key")
        body_hash = hashlib.sha256(raw).hexdigest()
        action = api.next_action()
        if action == "reset":
            self._reset()
            return
        with api._lock:
            stored = api._remembered(key) if key else None
            if stored is not None and stored.body_hash != body_hash:
                conflict = "invalid_idempotent_request"
            elif stored is not None and not stored.done.is_set():
                conflict = "concurrent_idempotent_requests"
            else:
                conflict = ""
            if stored is None and key:
                stored = api._keys[key] = _Stored(body_hash, api.now())
        if conflict:
            self._reply(409, {"statusCode": 409, "name": conflict})
            return
        if stored is not None and stored.done.is_set() and stored.status:
            self._replay(stored)
            return
        self._act(action, key, body, stored)

    def _reset(self) -> None:
        self.connection.shutdown(socket.SHUT_RDWR)
        self.connection.close()
        self.close_connection = True

    def date_time_string(self, timestamp: float | None = None) -> str:
        """One instant per response, for `Date` and an HTTP-date `Retry-After` alike."""
        return format_datetime(getattr(self, "_instant", None) or clock.real_now(), usegmt=True)

    def _replay(self, stored: _Stored) -> None:
        self.send_response(stored.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(stored.response)))
        self.send_header("Idempotency-Replayed", "true")
        self.end_headers()
        self.wfile.write(stored.response)

    def _forget(self, key: str | None) -> None:
        """Failures are not stored: a retry with the same key is processed afresh."""
        if key:
            with self.api._lock:
                self.api._keys.pop(key, None)

    def _act(
        self, action: str, key: str | None, body: dict[str, Any], stored: _Stored | None
    ) -> None:
        kind, _, argument = action.partition(":")
        if kind in ("409-in-progress", "409-mismatch"):
            self._forget(key)
            name = (
                "concurrent_idempotent_requests"
                if kind == "409-in-progress"
                else "invalid_idempotent_request"
            )
            self._reply(409, {"statusCode": 409, "name": name})
            return
        if kind == "429":
            self._forget(key)
            if argument.startswith("date:"):
                seconds = float(argument.removeprefix("date:"))
                self._instant = clock.real_now().replace(microsecond=0)
                retry_after = self._instant + timedelta(seconds=seconds)
                headers = {"Retry-After": format_datetime(retry_after, usegmt=True)}
            else:
                headers = {"Retry-After": argument or "1"}
            self._reply(429, {"name": "rate_limit_exceeded"}, headers)
            return
        if kind.isdigit() and kind not in ("200",):
            self._forget(key)
            extra = {"Retry-After": argument} if argument else {}
            self._reply(int(kind), {"name": "scripted_failure", "statusCode": int(kind)}, extra)
            return
        message_id = self.api._deliver(key, body)
        response = json.dumps({"id": message_id}).encode()
        if stored is not None:
            stored.status, stored.response = 200, response
            stored.done.set()
        if kind == "accept-then-timeout":
            self.api._release.wait(float(argument or "2"))
        elif kind == "accept-then-reset":
            self._reset()
            return
        self._reply(200, {"id": message_id})

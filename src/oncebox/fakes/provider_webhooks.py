"""`WebhookEmitter`: the delivery webhooks an email provider sends, as Resend sends them (Svix).

`FakeEmailApi.send_webhooks` builds one; for every message the fake delivers (not for an
idempotent replay) it emits the message's events — `email.sent`, then the final event — to a
receiver, as Svix does for Resend:

- the payload `{"type", "created_at", "data": {"email_id", "created_at", "from", "to",
  "subject", "tags": {name: value}, "headers": [{name, value}]}}` as compact JSON (`tags` and
  `headers` only when the request had them; a bounce carries `data.bounce`);
- headers `svix-id` (`msg_…`, the same on every attempt and duplicate: receivers dedupe on it),
  `svix-timestamp` (Unix seconds of this attempt, on the real clock) and `svix-signature`
  (`v1,<base64 HMAC-SHA256>` of `"{id}.{timestamp}.{body}"`, `sign_webhook`);
- delivery by one daemon thread, in order, each event `delay` seconds after it happened (on
  the monotonic clock); a non-2xx answer or a connection error is retried up to `attempts`
  times, `backoff` seconds doubling between them, re-signed with a fresh timestamp each time;
  then it is given up. No redirect is followed (`http.client`).

The final event is scripted by `outcomes`: a mapping from recipient address to event type (the
first of a message's `to` addresses found there decides), or a function of the request body;
anything else is `email.delivered`. Sequences: delivered = sent, delivered; complained = sent,
delivered, complained (a complaint follows a delivery); failed = failed alone; any other X =
sent, X.

Faults for the receiver's tests: `duplicates=N` sends each event N more times (same svix-id),
`reorder=True` sends a message's events last first, `bad_signature_every=K` precedes every K-th
event with a forged copy (signed under another key, which a receiver must refuse with a 4xx);
`emit_raw(..., stale=True)` precedes one event with a copy signed 10 minutes ago (outside any
replay window). A forged or stale copy is one extra attempt, never retried, always followed by
the real event. Every attempt is recorded in `log` (`WebhookAttempt`); `wait(timeout)` blocks
until every event has been answered 2xx or given up.
"""

from __future__ import annotations

import http.client
import json
import queue
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from oncebox.kernel import clock
from oncebox.providers.webhook_signatures import sign_webhook, signing_key

Outcomes = Mapping[str, str] | Callable[[Mapping[str, Any]], str]

DELIVERED = "email.delivered"
SEQUENCES: dict[str, tuple[str, ...]] = {
    DELIVERED: ("email.sent", DELIVERED),
    "email.complained": ("email.sent", DELIVERED, "email.complained"),
    "email.failed": ("email.failed",),
}
STALE_BY = timedelta(minutes=10)
BOUNCE = {
    "message": "The recipient's mail server permanently rejected the email.",
    "subType": "General",
    "type": "Permanent",
}


class WebhookAttempt(NamedTuple):
    """One POST: its event, the answer (HTTP status, or the connection error as text), and
    whether it was properly signed and fresh (False for a forged or stale copy)."""

    svix_id: str
    type: str
    outcome: int | str
    signed_ok: bool


@dataclass(frozen=True)
class _Job:
    svix_id: str
    type: str
    body: bytes
    due: float  # on the monotonic clock
    flaw: str | None = None  # "forged" / "stale": one extra first attempt
    message_id: str | None = None
    rank: int = 0  # the event's place in its message's sequence (for `last_event`)


def rfc3339_ms(instant: datetime) -> str:
    """`2026-08-17T09:00:00.123Z`: the event's `created_at` as Resend writes it."""
    return instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def header_list(body: Mapping[str, Any]) -> list[dict[str, str]]:
    """The request's `headers` as Resend's list of `{name, value}` (it accepts a dict too)."""
    headers = body.get("headers") or {}
    if isinstance(headers, Mapping):
        return [{"name": str(k), "value": str(v)} for k, v in headers.items()]
    return [
        {"name": str(h.get("name")), "value": str(h.get("value"))}
        for h in headers
        if isinstance(h, Mapping)
    ]


def header_value(body: Mapping[str, Any], name: str) -> str | None:
    """One header of the request, by name in any case, dict or list form."""
    for header in header_list(body):
        if header["name"].lower() == name.lower():
            return header["value"]
    return None


def tag_list(body: Mapping[str, Any]) -> list[dict[str, str]]:
    """The request's `tags`, Resend's send format: a list of `{name, value}`."""
    tags = body.get("tags") or []
    return [
        {"name": str(t.get("name")), "value": str(t.get("value"))}
        for t in tags
        if isinstance(t, Mapping)
    ]


def recipients(body: Mapping[str, Any]) -> list[str]:
    to = body.get("to") or []
    return [to] if isinstance(to, str) else [str(address) for address in to]


def email_data(message_id: str, body: Mapping[str, Any], created_at: datetime) -> dict[str, Any]:
    """A webhook's `data`: the email as Resend describes it in its events (tags as an object)."""
    data: dict[str, Any] = {
        "email_id": message_id,
        "created_at": created_at.isoformat(),
        "from": body.get("from"),
        "to": recipients(body),
        "subject": body.get("subject"),
    }
    if tags := tag_list(body):
        data["tags"] = {t["name"]: t["value"] for t in tags}
    if headers := header_list(body):
        data["headers"] = headers
    return data


def email_object(
    message_id: str, body: Mapping[str, Any], created_at: datetime, last_event: str
) -> dict[str, Any]:
    """`GET /emails/{id}`'s answer, as Resend's retrieve-email (tags as sent: a list)."""
    return {
        "object": "email",
        "id": message_id,
        "to": recipients(body),
        "from": body.get("from"),
        "subject": body.get("subject"),
        "html": body.get("html"),
        "text": body.get("text"),
        "cc": body.get("cc"),
        "bcc": body.get("bcc"),
        "reply_to": body.get("reply_to"),
        "created_at": created_at.isoformat(),
        "last_event": last_event,
        "tags": tag_list(body),
    }


class WebhookEmitter:
    def __init__(
        self,
        url: str,
        secret: str,
        *,
        delay: float = 0.0,
        duplicates: int = 0,
        reorder: bool = False,
        bad_signature_every: int = 0,
        outcomes: Outcomes | None = None,
        timeout: float = 3.0,
        attempts: int = 8,
        backoff: float = 0.05,
    ) -> None:
        split = urlsplit(url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise ValueError(f"a webhook URL is http:// or https://, not {url!r}")
        if delay < 0 or duplicates < 0 or bad_signature_every < 0 or backoff < 0:
            raise ValueError("delay, duplicates, bad_signature_every and backoff are >= 0")
        if not 1 <= attempts <= 20:
            raise ValueError("attempts is between 1 and 20")
        if isinstance(outcomes, Mapping) and (
            odd := sorted(t for t in outcomes.values() if not t.startswith("email."))
        ):
            raise ValueError(f"outcomes are event types such as 'email.bounced', not {odd}")
        self.url = url
        self._split = split
        self._key = signing_key(secret)
        self.delay = delay
        self.duplicates = duplicates
        self.reorder = reorder
        self.bad_signature_every = bad_signature_every
        self.outcomes = outcomes
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.log: list[WebhookAttempt] = []
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._settled = threading.Condition()
        self._pending = 0
        self._emitted = 0
        self._sequences: dict[str, tuple[str, ...]] = {}
        self._reached: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="fake-provider-webhooks", daemon=True
        )
        self._thread.start()

    def final_event(self, body: Mapping[str, Any]) -> str:
        if callable(self.outcomes):
            return self.outcomes(body)
        for address in recipients(body):
            if self.outcomes is not None and address in self.outcomes:
                return self.outcomes[address]
        return DELIVERED

    def emit_email(self, message_id: str, body: Mapping[str, Any], created_at: datetime) -> None:
        """Queue the events of one delivered message (nothing once stopped)."""
        final = self.final_event(body)
        sequence = SEQUENCES.get(final, ("email.sent", final))
        data = email_data(message_id, body, created_at)
        with self._settled:
            self._sequences[message_id] = sequence
        events = list(enumerate(sequence))
        for rank, event_type in reversed(events) if self.reorder else events:
            extra = {"bounce": BOUNCE} if event_type == "email.bounced" else {}
            payload = {
                "type": event_type,
                "created_at": rfc3339_ms(clock.real_now()),
                "data": {**data, **extra},
            }
            svix_id = _svix_id()
            for _ in range(1 + self.duplicates):
                self._put(svix_id, event_type, payload, message_id=message_id, rank=rank)

    def emit_raw(
        self,
        event_type: str,
        data: Mapping[str, Any],
        *,
        stale: bool = False,
        forged: bool = False,
        svix_id: str | None = None,
    ) -> str:
        """Queue one event of any type and data, once (no duplicates, reorder or counted
        forgery); `stale` / `forged` precede it with a copy signed 10 minutes ago / under
        another key. Returns its svix-id."""
        if stale and forged:
            raise ValueError("one flaw at a time: stale or forged")
        svix_id = svix_id or _svix_id()
        payload = {"type": event_type, "created_at": rfc3339_ms(clock.real_now()), "data": data}
        flaw = "stale" if stale else "forged" if forged else None
        self._put(svix_id, event_type, payload, flaw=flaw, counted=False)
        return svix_id

    def _put(
        self,
        svix_id: str,
        event_type: str,
        payload: Mapping[str, Any],
        *,
        flaw: str | None = None,
        counted: bool = True,
        message_id: str | None = None,
        rank: int = 0,
    ) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode()
        with self._settled:
            if self._stop.is_set():
                return
            if counted:
                self._emitted += 1
                every = self.bad_signature_every
                flaw = "forged" if every and self._emitted % every == 0 else None
            self._pending += 1
            due = clock.monotonic() + self.delay
            # under the lock: once `stop` has queued its end mark, nothing is queued behind it
            self._queue.put(_Job(svix_id, event_type, body, due, flaw, message_id, rank))

    def last_event(self, message_id: str) -> str | None:
        """The latest of a message's events to have happened (its turn to be sent came), as
        Resend's `last_event` names it; "queued" before any; None for a message it never saw.
        Reordered or duplicated delivery does not move it back."""
        with self._settled:
            sequence = self._sequences.get(message_id)
            if sequence is None:
                return None
            reached = self._reached.get(message_id)
            return "queued" if reached is None else sequence[reached].removeprefix("email.")

    def wait(self, timeout: float = 10.0) -> bool:
        """Block until every queued event has been answered 2xx or given up; False on timeout."""
        with self._settled:
            return self._settled.wait_for(lambda: self._pending == 0, timeout)

    def stop(self) -> None:
        """Stop sending: queued events are dropped (`wait` then returns True), the thread ends."""
        with self._settled:
            self._stop.set()
            self._queue.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(self.timeout + 1)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                if not self._stop.wait(max(0.0, job.due - clock.monotonic())):
                    self._happened(job)
                    self._deliver(job)
            finally:
                with self._settled:
                    self._pending -= 1
                    self._settled.notify_all()

    def _happened(self, job: _Job) -> None:
        if job.message_id is not None:
            with self._settled:
                before = self._reached.get(job.message_id, -1)
                self._reached[job.message_id] = max(before, job.rank)

    def _deliver(self, job: _Job) -> None:
        if job.flaw is not None:
            self._attempt(job, job.flaw)
        wait = self.backoff
        for attempt in range(1, self.attempts + 1):
            outcome = self._attempt(job, None)
            if isinstance(outcome, int) and 200 <= outcome < 300:
                return
            if attempt == self.attempts or self._stop.wait(wait):
                return
            wait *= 2

    def _attempt(self, job: _Job, flaw: str | None) -> int | str:
        instant = clock.real_now() - (STALE_BY if flaw == "stale" else timedelta())
        stamp = str(int(instant.timestamp()))
        key = self._key + b"-forged" if flaw == "forged" else self._key
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "Svix-Webhooks/1.0 (oncebox fake)",
            "svix-id": job.svix_id,
            "svix-timestamp": stamp,
            "svix-signature": sign_webhook(key, job.svix_id, stamp, job.body),
        }
        outcome = self._post(job.body, headers)
        with self._settled:
            self.log.append(WebhookAttempt(job.svix_id, job.type, outcome, flaw is None))
        return outcome

    def _post(self, body: bytes, headers: dict[str, str]) -> int | str:
        split = self._split
        kind = (
            http.client.HTTPSConnection if split.scheme == "https" else http.client.HTTPConnection
        )
        connection = kind(str(split.hostname), split.port, timeout=self.timeout)
        path = (split.path or "/") + (f"?{split.query}" if split.query else "")
        try:
            connection.request("POST", path, body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            return response.status
        except (OSError, http.client.HTTPException) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()


def _svix_id() -> str:
    return f"msg_{secrets.token_hex(13)}"

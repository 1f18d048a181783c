"""An HTTP email API that honours idempotency keys, modelled on Resend (`POST /emails`,
`Idempotency-Key`, a 24-hour window; SparkPost's API is similar and its 409 codes are understood
too).

URLs: `resend://` (https://api.resend.com) or `resend+http://host:port` / `resend+https://…` for
another base URL (a local fake, a proxy). The API key comes from the environment —
`ONCEBOX_EMAIL_API_KEY`, or the variable named by `?api_key_env=NAME` — never from the URL, and
is never logged. Options: `?timeout=SECONDS&window_hours=24`; `?lookup=message_id` for an API
that can search what it took by our Message-ID (`GET /emails?message_id=…`, as Mailgun's events
and Postmark's outbound search can; Resend cannot), so the resolver can settle held sends by
asking — a message not found is resent only after `?lookup_lag_s=300` seconds since it was
held (a provider's search trails its intake).

Classification (see providers/base.py): 2xx sent (the receipt is the body's `id`); connection
refused or connect timeout → retryable (nothing was sent); a timeout or a broken connection after
the request was written → ambiguous (resent with the same key: the provider replays the first
answer); 408, 425 Too Early (RFC 8470 asks the client to retry) and 5xx → retryable; 429 → the
whole channel pauses until `Retry-After`; 409 "a request with this key is in progress" →
retryable soon; 409 "this key was used with a different body" → permanent, and an alarm (content
changed under a key); other 4xx → permanent. Redirects are never followed. A body that cannot be
parsed (not JSON, not UTF-8, nested too deeply for the parser) counts as no body: a 2xx is still a
receipt, without an id. At most 16 KiB of a reply is read, counted decompressed
(`providers/replies.py`); a longer one, or one that cannot be decoded, is refused past the cap and
counts as a body that cannot be parsed — the status still classifies the send, the reason says the
reply was cut, and a lookup learns nothing from it ("unknown", never "not found").
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import httpx2

from oncebox.deliveries.events import token_of
from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.url_options import number_option
from oncebox.providers.base import (
    Capabilities,
    Outgoing,
    Receipt,
    SendAmbiguous,
    SendPermanent,
    SendRetryable,
    SendThrottled,
    StatusAnswer,
)
from oncebox.providers.email import render
from oncebox.providers.email_payload import MAX_EMAIL_BYTES, check_email_payload
from oncebox.providers.replies import Reply, parse_retry_after, read_reply

IN_PROGRESS = {"concurrent_idempotent_requests", "1601"}
KEY_REUSED = {"invalid_idempotent_request", "1600"}


def _parsed(reply: Reply) -> Any:
    """The body as JSON, or None when it is not JSON the parser can take (a deeply nested body
    raises RecursionError from the parser, not ValueError) or was not read whole."""
    if reply.refused is not None:
        return None
    try:
        return json.loads(reply.body)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


def _error_code(body: Any) -> str:
    if isinstance(body, dict):
        if isinstance(body.get("name"), str):
            return str(body["name"])
        errors = body.get("errors")
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            return str(errors[0].get("code", ""))
    return ""


CAPABILITIES = Capabilities(close=True, check_payload=True, max_payload_bytes=MAX_EMAIL_BYTES)


class HttpEmailProvider:
    name = "http"
    idempotent = True

    @property
    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        options = dict(parse_qsl(parts.query))
        if parts.scheme == "resend":
            self.base_url = "https://api.resend.com"
        else:
            scheme = parts.scheme.split("+", 1)[1]
            self.base_url = urlunsplit((scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        env = options.get("api_key_env", "ONCEBOX_EMAIL_API_KEY")
        self._api_key = os.environ.get(env, "")
        self.timeout = number_option(options, "timeout", 30.0, low=0.1, high=3600, unit="seconds")
        window = timedelta(
            hours=number_option(options, "window_hours", 24.0, low=0, high=24 * 365, unit="hours")
        )
        self.idempotency_window: timedelta | None = window
        self.where = self.base_url
        self.lookup_lag = timedelta(
            seconds=number_option(options, "lookup_lag_s", 300.0, low=0, high=86400, unit="s")
        )
        self._client = httpx2.Client(
            base_url=self.base_url,
            timeout=httpx2.Timeout(self.timeout),
            follow_redirects=False,
        )

    def _body(self, outgoing: Outgoing) -> dict[str, Any]:
        payload = outgoing.payload
        message = render(outgoing)
        body: dict[str, Any] = {
            "from": message["From"],
            "to": payload["to"],
            "subject": payload["subject"],
            "headers": {
                **payload.get("headers", {}),
                "Message-ID": outgoing.message_id,
                "X-Oncebox-Token": outgoing.token,
            },
            # what the provider's delivery webhooks name the message by (deliveries/events.py)
            "tags": [{"name": "oncebox", "value": outgoing.token}],
        }
        for field in ("text", "html", "reply_to"):
            if payload.get(field) is not None:
                body[field] = payload[field]
        return body

    def check_payload(self, payload: Mapping[str, Any]) -> None:
        """Refuse, when written, a message this email provider could never render."""
        check_email_payload(payload)

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        headers = {"Idempotency-Key": idempotency_key}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            with self._client.stream(
                "POST", "/emails", json=self._body(outgoing), headers=headers
            ) as response:
                reply = read_reply(response)
        except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as exc:
            raise SendRetryable(f"{self.where}: not sent ({type(exc).__name__}: {exc})") from None
        except httpx2.TransportError as exc:
            raise SendAmbiguous(
                f"{self.where}: {type(exc).__name__} after the request was sent ({exc}); "
                "it may have been accepted"
            ) from None
        return self._classify(response, reply)

    def _classify(self, response: httpx2.Response, reply: Reply) -> Receipt:
        status = response.status_code
        text = reply.body[: 500 if reply.refused is None else 200].decode("utf-8", "replace")
        cut = "" if reply.refused is None else f" … ({reply.refused})"
        body = _parsed(reply)
        reason = f"{self.where}: HTTP {status} {text}".strip() + cut
        if 200 <= status < 300:
            if isinstance(body, dict) and isinstance(body.get("id"), str):
                return Receipt(body["id"], f"HTTP {status}")
            return Receipt(None, f"HTTP {status} without a message id: {text!r}{cut}")
        if status == 429:
            wait = parse_retry_after(
                response.headers.get("retry-after"), response.headers.get("date")
            )
            raise SendThrottled(reason, wait)
        if status == 409:
            code = _error_code(body)
            if code in KEY_REUSED:
                raise SendPermanent(
                    f"{reason} (this key was used with a different body)", alarm=True
                )
            wait = parse_retry_after(response.headers.get("retry-after"))
            raise SendRetryable(f"{reason} (a request with this key is in progress)", wait)
        if status in (401, 403):  # credentials: every message would fail alike
            raise SendThrottled(f"{reason} (check the channel's API key)")
        if status in (408, 425) or status >= 500:
            raise SendRetryable(reason, parse_retry_after(response.headers.get("retry-after")))
        raise SendPermanent(reason)

    def close(self) -> None:
        self._client.close()


class SearchableHttpEmailProvider(HttpEmailProvider):
    """An HTTP email API that can be asked what became of a message it may have taken: its
    search by our Message-ID (`?lookup=message_id`). Found — one of the answers carries this
    message's token, as its tag or header — and not failed: "sent", its id the receipt; none
    found: "not_found" (resent once `lookup_lag` has passed since the row was held); found
    failed, answers that are none of ours (a search that ignored the filter), an answer it
    cannot read, or the search unavailable: "unknown" (held for a report or a person)."""

    @property
    def capabilities(self) -> Capabilities:
        return replace(CAPABILITIES, lookup=True, lookup_lag=self.lookup_lag)

    def status(
        self, outgoing: Outgoing, idempotency_key: str
    ) -> tuple[StatusAnswer, Receipt | None]:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            with self._client.stream(
                "GET", "/emails", params={"message_id": outgoing.message_id}, headers=headers
            ) as response:
                reply = read_reply(response)
        except httpx2.TransportError:
            return "unknown", None
        body = _parsed(reply)  # None for a reply too long to read: no evidence either way
        data = body.get("data") if isinstance(body, dict) else None
        if response.status_code != 200 or not isinstance(data, list):
            return "unknown", None  # an answer it cannot read is no evidence either way
        if not data:
            return "not_found", None
        ours = [
            item for item in data if isinstance(item, dict) and token_of(item) == outgoing.token
        ]
        if not ours:
            return "unknown", None  # messages, none of them ours: the search did not search
        taken = [item for item in ours if item.get("last_event") not in ("failed", "canceled")]
        if not taken:
            return "unknown", None
        provider_id = taken[0].get("id")
        return "sent", Receipt(provider_id if isinstance(provider_id, str) else None, "looked up")


def http_provider(url: str) -> HttpEmailProvider:
    """The provider a `resend…://` URL names: searchable when it says `?lookup=message_id`."""
    lookup = dict(parse_qsl(urlsplit(url).query)).get("lookup")
    if lookup is None:
        return HttpEmailProvider(url)
    if lookup != "message_id":
        raise ConfigurationError(f"lookup={lookup!r}: the only lookup is lookup=message_id")
    return SearchableHttpEmailProvider(url)

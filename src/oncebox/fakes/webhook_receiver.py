"""`WebhookReceiver`: a webhook endpoint on loopback that checks signatures as a receiver should.

Every POST is checked with `verify_webhook` under the receiver's secret: one that fails is
answered `401` and its reason kept in `refused`, nothing else recorded. One that passes is kept in
`received` (its webhook-id, timestamp, payload, Host header, path, headers and raw body), then
answered as scripted — actions apply to the next verified requests, in order:

    "ok"                            process it, answer 200 `{"id": "rcv-N"}` (the default)
    "500", "503:120", "410", "429:30", …   that status, not processed ("503:120", "429:30":
                                    with Retry-After)
    "302:URL", "307:URL", …         a redirect to URL, not processed
    "accept-then-timeout:SECONDS"   process it, then answer only after SECONDS (past the
                                    client's timeout: the sender cannot know)
    "accept-then-reset"             process it, then close the connection without answering

A receiver built with `dedupe=True` processes each webhook-id once, as receivers that dedupe must:
a repeat is answered 200 again and counted in `repeats`, not processed. `processed` lists the
webhook-ids it acted on. With `tls=` (a server `ssl.SSLContext`) it serves HTTPS and records in
`server_names` the name each client asked for (SNI).
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

from oncebox.fakes.loopback import LoopbackServer
from oncebox.kernel import clock
from oncebox.providers.webhook_signatures import WebhookRefused, verify_webhook


@dataclass(frozen=True)
class Received:
    webhook_id: str
    timestamp: int
    payload: dict[str, Any]
    host: str
    path: str
    headers: dict[str, str]
    body: bytes


class WebhookReceiver(LoopbackServer):
    def __init__(
        self,
        secret: str,
        host: str = "127.0.0.1",
        *,
        dedupe: bool = False,
        tls: ssl.SSLContext | None = None,
        now: Callable[[], datetime] = clock.real_now,
    ) -> None:
        self.secret = secret
        self.dedupe = dedupe
        self.now = now  # the clock signatures are checked against
        self.received: list[Received] = []
        self.refused: list[str] = []
        self.processed: list[str] = []
        self.repeats = 0
        self.server_names: list[str | None] = []
        self._script: deque[str] = deque()
        self._lock = threading.Lock()
        self.scheme = "http" if tls is None else "https"
        if tls is not None:
            tls.sni_callback = self._sni
        self._listen(type("Handler", (_Handler,), {"receiver": self}), host, tls)

    def _sni(self, _sock: Any, name: str | None, _context: ssl.SSLContext) -> None:
        with self._lock:
            self.server_names.append(name)

    @property
    def url(self) -> str:
        """The channel URL of this endpoint, before options (`?secret_env=…&allow=…`)."""
        return f"webhook+{self.scheme}://{self.host}:{self.port}/hook"

    def script(self, *actions: str) -> None:
        with self._lock:
            self._script.extend(actions)

    def ids(self) -> list[str]:
        """The webhook-id of each verified request, in arrival order."""
        with self._lock:
            return [r.webhook_id for r in self.received]

    def _next(self, received: Received) -> str:
        with self._lock:
            self.received.append(received)
            return self._script.popleft() if self._script else "ok"

    def _process(self, webhook_id: str) -> None:
        with self._lock:
            if self.dedupe and webhook_id in self.processed:
                self.repeats += 1
            else:
                self.processed.append(webhook_id)


class _Handler(BaseHTTPRequestHandler):
    receiver: WebhookReceiver
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # see fakes/email_api.py

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read `received` and `refused`, not stderr."""

    def _reply(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def do_POST(self) -> None:
        receiver = self.receiver
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        headers = {name.lower(): value for name, value in self.headers.items()}
        try:
            payload = verify_webhook(receiver.secret, headers, raw, now=receiver.now())
        except WebhookRefused as exc:
            with receiver._lock:
                receiver.refused.append(exc.reason)
            self._reply(401, {"error": exc.reason}, {})
            return
        webhook_id = headers["webhook-id"]
        received = Received(
            webhook_id,
            int(headers["webhook-timestamp"]),
            payload,
            headers.get("host", ""),
            self.path,
            headers,
            raw,
        )
        kind, _, argument = receiver._next(received).partition(":")
        if kind in ("ok", "accept-then-timeout", "accept-then-reset"):
            receiver._process(webhook_id)
            if kind == "accept-then-timeout":
                receiver._release.wait(float(argument or "2"))
            elif kind == "accept-then-reset":
                self.connection.shutdown(socket.SHUT_RDWR)
                self.connection.close()
                self.close_connection = True
                return
            self._reply(200, {"id": f"rcv-{len(receiver.received)}"}, {})
            return
        status = int(kind)
        extra: dict[str, str] = {}
        if 300 <= status < 400:
            extra["Location"] = argument
        elif argument:
            extra["Retry-After"] = argument
        self._reply(status, {"error": "scripted", "status": status}, extra)

"""`SmtpSink`: a scripted SMTP server on loopback; see the package docstring."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections import deque
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from typing import Any


@dataclass(frozen=True)
class ReceivedMail:
    token: str | None
    message_id: str | None
    mail_from: str
    rcpt_tos: tuple[str, ...]
    message: Message


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class SmtpSink:
    """Replies, in order, with the scripted actions, then accepts. An action is an SMTP reply
    (`"451 4.7.1 greylisted"`, `"421 4.3.2 slow down"`, `"550 5.1.1 no such user"`) — the message
    is then *not* received — or `"drop"`: the message is received, and the connection is closed
    before the reply (the lost acknowledgement); or `"accept-then-timeout:SECONDS"`: received,
    and the 250 sent only after SECONDS (past the client's timeout)."""

    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    received: list[ReceivedMail] = field(default_factory=list)
    _script: deque[tuple[str | None, str]] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    tls_cert: str | None = None  # with tls_key: offer STARTTLS (and require it)
    tls_key: str | None = None
    implicit_tls: bool = False  # with tls_cert and tls_key: TLS from the first byte (smtps://)
    login: tuple[str, str] | None = None  # require AUTH with these credentials
    logins: list[str] = field(default_factory=list)  # who logged in, in order
    _controller: Any = None

    @property
    def url(self) -> str:
        return f"smtp://{self.host}:{self.port}?timeout=5"

    def script(self, *actions: str, token: str | None = None) -> None:
        """Queue actions for the next messages (or only for the message with `token`)."""
        with self._lock:
            self._script.extend((token, action) for action in actions)

    def _next_action(self, token: str | None) -> str:
        with self._lock:
            for index, (for_token, action) in enumerate(self._script):
                if for_token is None or for_token == token:
                    del self._script[index]
                    return action
        return "250 OK"

    def tokens(self) -> list[str | None]:
        with self._lock:
            return [mail.token for mail in self.received]

    def start(self) -> SmtpSink:
        from aiosmtpd.controller import Controller  # noqa: PLC0415 (an optional dependency)

        options: dict[str, Any] = {}
        if self.tls_cert and self.tls_key:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(self.tls_cert, self.tls_key)
            if self.implicit_tls:
                # aiosmtpd offers AUTH only after its own STARTTLS unless told the session is
                # already private, as it is here (and then warns if AUTH is also required, so it
                # is optional: `logins` shows who logged in)
                options.update(ssl_context=context, auth_require_tls=False)
            else:
                options.update(tls_context=context, require_starttls=True)
        if self.login is not None:
            options.update(auth_required=not self.implicit_tls, authenticator=_Authenticator(self))
        self._controller = Controller(_Handler(self), hostname=self.host, port=self.port, **options)
        self._controller.start()
        return self

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def __enter__(self) -> SmtpSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Authenticator:
    def __init__(self, sink: SmtpSink) -> None:
        self.sink = sink

    def __call__(self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> Any:
        from aiosmtpd.smtp import AuthResult, LoginPassword  # noqa: PLC0415

        ok = (
            isinstance(data, LoginPassword)
            and (data.login.decode(), data.password.decode()) == self.sink.login
        )
        if ok:
            with self.sink._lock:
                self.sink.logins.append(data.login.decode())
        return AuthResult(success=ok, handled=False)


class _Handler:
    def __init__(self, sink: SmtpSink) -> None:
        self.sink = sink

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = message_from_bytes(envelope.original_content or envelope.content)
        token = message.get("X-Oncebox-Token")
        action = self.sink._next_action(token)
        received = ReceivedMail(
            token, message.get("Message-ID"), envelope.mail_from, tuple(envelope.rcpt_tos), message
        )
        if action == "drop":
            with self.sink._lock:
                self.sink.received.append(received)
            server.transport.close()  # the server has the message; the client never hears so
            return "250 OK"
        if action.startswith("accept-then-timeout"):
            # the server has the message; its 250 comes after the client's timeout
            with self.sink._lock:
                self.sink.received.append(received)
            await asyncio.sleep(float(action.partition(":")[2] or "2"))
            return "250 OK"
        if action.startswith("2"):
            with self.sink._lock:
                self.sink.received.append(received)
        return action

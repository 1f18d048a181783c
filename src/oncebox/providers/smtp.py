"""SMTP (`smtp://` with optional STARTTLS, `smtps://`), with the standard library.

SMTP has no idempotency key, so the dispatcher marks a row `sending` before each call and the
channel's ambiguity policy decides what an unknown outcome means. This provider's job is to say
*which* outcome it was, by the phase the failure happened in (RFC 1047's duplicate window):

- before the message content was completely written (connect, EHLO, MAIL, RCPT, the DATA command,
  writing the content): nothing was delivered — retryable, or the reply's class;
- after the final `.` was written and before the server's reply arrived (timeout, connection
  lost): the server may have queued it — ambiguous.

Each dispatcher thread keeps its connection open across messages; a reused connection the server
has meanwhile closed fails at MAIL, before anything was sent, and is replaced once.

Replies: 421 pauses the channel (SMTP has no Retry-After); other 4xx (451 greylisting, 452) are
retried per message; 5xx (550 no such user) are permanent. A refused session (authentication,
TLS) is the channel's problem, not the message's: the channel pauses and no attempt is spent.
At most 16 KiB of each reply is read (`providers/replies.py`; smtplib caps a line, not how many
lines a multi-line reply has): past it the connection is closed as if it were lost — nothing was
sent before the end of the data, and after it the message may have been accepted.

URL: `smtp://[user:password@]host[:port][?starttls=1&timeout=30&cafile=PATH&insecure_auth=1]`,
`smtps://…` (implicit TLS). Certificates are always verified (against the system's CAs, or
`cafile`). The password may be given as `?password_env=NAME` instead, and is never logged.

Credentials cross the wire only inside TLS. Port 465 and `smtps://` speak TLS from the first byte;
anywhere else a URL with credentials upgrades with STARTTLS, and a server that does not offer it
(or an attacker on the path who stripped it from the EHLO reply) gets no AUTH: the session is
refused, the channel pauses, the reason names the server. The exceptions are a server reached at
a loopback address — the connection's own peer, not the name, decides — and `?insecure_auth=1`,
which sends them in the clear on purpose. `starttls=1` requires STARTTLS with or without
credentials; `starttls=0` never tries it (credentials then go only where plain AUTH is allowed).
Unknown options and `starttls=1` with implicit TLS are refused when the channel is declared.
"""

from __future__ import annotations

import ipaddress
import os
import re
import smtplib
import ssl
import threading
from collections.abc import Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.url_options import flag_option, number_option
from oncebox.providers.base import (
    Capabilities,
    Outgoing,
    Receipt,
    SendAmbiguous,
    SendError,
    SendPermanent,
    SendRetryable,
    SendThrottled,
)
from oncebox.providers.email import render
from oncebox.providers.email_payload import MAX_EMAIL_BYTES, check_email_payload
from oncebox.providers.replies import CAP, MAX_REPLY_BYTES

_EOL = re.compile(rb"\r\n|\r|\n")
OPTIONS = frozenset({"starttls", "insecure_auth", "timeout", "cafile", "password_env"})
IMPLICIT_TLS_PORT = 465


def _reply_error(code: int, text: bytes | str, phase: str) -> SendError:
    message = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
    reason = f"SMTP {code} at {phase}: {message.strip()}"
    if code == 421:
        return SendThrottled(reason, smtp_421=True)
    if 400 <= code < 500:
        return SendRetryable(reason)
    if 500 <= code < 600:
        return SendPermanent(reason)
    return SendRetryable(reason)


def dot_stuffed(message: bytes) -> bytes:
    """The DATA payload: CRLF line ends, leading dots doubled, ending with CRLF.CRLF."""
    lines = _EOL.split(message)
    if lines and lines[-1] == b"":
        lines.pop()
    body = b"\r\n".join(b"." + line if line.startswith(b".") else line for line in lines)
    return body + b"\r\n.\r\n"


class SmtpProvider:
    name = "smtp"
    idempotent = False
    idempotency_window: timedelta | None = None
    capabilities = Capabilities(close=True, check_payload=True, max_payload_bytes=MAX_EMAIL_BYTES)

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        options = dict(parse_qsl(parts.query, keep_blank_values=True))
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (IMPLICIT_TLS_PORT if parts.scheme == "smtps" else 25)
        self.where = f"{parts.scheme}://{self.host}:{self.port}"
        unknown = sorted(set(options) - OPTIONS)
        if unknown:
            raise ConfigurationError(
                f"SMTP URL {self.where}: unknown option(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(OPTIONS))})"
            )
        self.implicit_tls = parts.scheme == "smtps" or self.port == IMPLICIT_TLS_PORT
        try:
            starttls = flag_option(options, "starttls")
            self.insecure_auth = bool(flag_option(options, "insecure_auth"))
            self.timeout = number_option(
                options, "timeout", 30.0, low=0.1, high=3600, unit="seconds"
            )
        except ConfigurationError as exc:
            raise ConfigurationError(f"SMTP URL {self.where}: {exc}") from None
        if starttls and self.implicit_tls:
            raise ConfigurationError(
                f"SMTP URL {self.where}: starttls=1 with implicit TLS (smtps://, or port "
                f"{IMPLICIT_TLS_PORT}, speaks TLS from the first byte): drop starttls=1, or use "
                "the submission port 587 for STARTTLS"
            )
        # True: required; False: never tried; None: required when credentials would be sent
        # to a server where plain AUTH is not allowed (see the module docstring)
        self.starttls = starttls
        self.user = unquote(parts.username) if parts.username else None
        password_env = options.get("password_env")
        self._password = (
            os.environ.get(password_env)
            if password_env
            else (unquote(parts.password) if parts.password else None)
        )
        self.cafile = options.get("cafile") or None  # a private CA (the certificate is verified)
        self._local = threading.local()
        self._open: set[smtplib.SMTP] = set()  # every thread's connection, for close()
        self._open_lock = threading.Lock()

    def _connect(self) -> smtplib.SMTP:
        context = ssl.create_default_context(cafile=self.cafile)
        smtp: smtplib.SMTP
        if self.implicit_tls:
            smtp = _CappedSmtpSsl(self.host, self.port, timeout=self.timeout, context=context)
        else:
            smtp = _CappedSmtp(self.host, self.port, timeout=self.timeout)
        try:
            smtp.ehlo()
            user, password = self.user, self._password
            login = user is not None and password is not None
            if not self.implicit_tls and (
                self.starttls or (self.starttls is None and login and not self._clear_ok(smtp))
            ):
                if not smtp.has_extn("starttls"):
                    raise self._refused(
                        "offers no STARTTLS"
                        + (
                            ", and credentials are sent only inside TLS (smtps:// or port "
                            f"{IMPLICIT_TLS_PORT} if it speaks TLS from the first byte; "
                            "?insecure_auth=1 to send them in the clear anyway)"
                            if login
                            else ", which starttls=1 requires"
                        )
                    )
                smtp.starttls(context=context)
                smtp.ehlo()
            if user is not None and password is not None:
                if not isinstance(smtp.sock, ssl.SSLSocket) and not self._clear_ok(smtp):
                    raise self._refused(
                        "is not at a loopback address and the connection is not encrypted "
                        "(starttls=0): credentials are sent only inside TLS (STARTTLS or "
                        "implicit TLS; ?insecure_auth=1 to send them in the clear anyway)"
                    )
                smtp.login(user, password)
        except BaseException:
            smtp.close()
            raise
        return smtp

    def _clear_ok(self, smtp: smtplib.SMTP) -> bool:
        """Whether credentials may cross this connection unencrypted: `?insecure_auth=1`, or a
        server whose address — the connection's peer, whatever the name resolved to — is
        loopback (they never leave the host)."""
        if self.insecure_auth:
            return True
        if smtp.sock is None:
            return False
        try:
            peer = str(smtp.sock.getpeername()[0])
            address = ipaddress.ip_address(peer.partition("%")[0])
        except (OSError, ValueError):
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return address.is_loopback

    def _refused(self, what: str) -> SendThrottled:
        """The session refused by this side: a configuration problem of the channel (every
        message would fail alike), so the channel pauses and no attempt is spent."""
        return SendThrottled(f"{self.where} {what}")

    def _session(self) -> tuple[smtplib.SMTP, bool]:
        """This thread's open connection (reused across messages), or a new one."""
        smtp: smtplib.SMTP | None = getattr(self._local, "smtp", None)
        if smtp is not None:
            return smtp, True
        smtp = self._connect()
        self._local.smtp = smtp
        with self._open_lock:
            self._open.add(smtp)
        return smtp, False

    def _discard(self) -> None:
        smtp: smtplib.SMTP | None = getattr(self._local, "smtp", None)
        self._local.smtp = None
        if smtp is not None:
            self._quit(smtp)

    def _quit(self, smtp: smtplib.SMTP) -> None:
        with self._open_lock:
            self._open.discard(smtp)
        try:
            smtp.quit()
        except (OSError, smtplib.SMTPException):
            smtp.close()

    def check_payload(self, payload: Mapping[str, Any]) -> None:
        """Refuse, when written, a message this email provider could never render."""
        check_email_payload(payload)

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        try:
            return self._send(outgoing)
        except _StaleConnection:
            self._discard()  # the server closed an idle connection: nothing was sent; once more
            return self._send(outgoing)

    def _send(self, outgoing: Outgoing) -> Receipt:
        message = render(outgoing)  # a malformed payload is SendPermanent, before any I/O
        sender = message["From"]
        recipients = list(outgoing.payload["to"])
        content = dot_stuffed(bytes(message))
        phase = "connect"
        reused = False
        try:
            smtp, reused = self._session()
            phase = "MAIL"
            code, text = smtp.mail(sender)
            if code == 421 and reused:
                raise _StaleConnection  # an idle connection the server timed out: not the channel
            if code != 250:
                raise _reply_error(code, text, phase)
            phase = "RCPT"
            for recipient in recipients:
                code, text = smtp.rcpt(recipient)
                if code not in (250, 251):
                    raise _reply_error(code, text, f"RCPT {recipient}")
            phase = "DATA"
            code, text = smtp.docmd("DATA")
            if code != 354:
                raise _reply_error(code, text, phase)
            phase = "content"
            smtp.send(content)
            phase = "end of data"  # from here on, the server may have the message
            code, text = smtp.getreply()
        except BaseException as exc:
            self._discard()  # never reuse a connection left in the middle of a transaction
            raise self._classify(exc, phase, reused) from None
        if code != 250:
            self._discard()
            raise _reply_error(code, text, phase)
        return Receipt(outgoing.message_id, f"{code} {text.decode('utf-8', 'replace')}".strip())

    def _classify(self, exc: BaseException, phase: str, reused: bool) -> BaseException:
        """What a failure during `phase` means; see the module docstring."""
        if isinstance(exc, (SendError, _StaleConnection)) or not isinstance(exc, Exception):
            return exc
        if reused and phase == "MAIL" and isinstance(exc, (OSError, smtplib.SMTPException)):
            return _StaleConnection()
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if phase == "end of data":
            return SendAmbiguous(
                f"{self.where}: the connection failed after the message was sent, before the "
                f"server's reply ({detail}); it may have been accepted"
            )
        if phase == "connect" and isinstance(
            exc, (smtplib.SMTPResponseException, smtplib.SMTPNotSupportedError, ssl.SSLError)
        ):
            if isinstance(exc, smtplib.SMTPResponseException):
                raw = exc.smtp_error
                detail = f"SMTP {exc.smtp_code} " + (
                    raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                )
            return SendThrottled(  # authentication or TLS: every message would fail alike
                f"{self.where} refused the session: {detail.strip()} (check the channel's "
                "credentials and TLS settings)"
            )
        if isinstance(exc, smtplib.SMTPResponseException):
            return _reply_error(exc.smtp_code, exc.smtp_error, phase)
        if isinstance(exc, UnicodeError):
            return SendPermanent(f"{self.where}: cannot send this message over SMTP ({detail})")
        return SendRetryable(f"{self.where}: {detail} during {phase} (nothing was sent)")

    def close(self) -> None:
        """Close every thread's connection."""
        with self._open_lock:
            connections, self._open = list(self._open), set()
        for smtp in connections:
            self._quit(smtp)
        self._local = threading.local()


class _StaleConnection(Exception):
    """A reused connection failed (or was timed out by the server: 421) before anything of the
    message was sent; `send` replaces it once."""


class _ReplyTooLarge(OSError):
    """A reply past the cap: smtplib closes the connection, as on any error reading a reply."""


class _Budget:
    """The server's side of a connection, as smtplib reads it (`readline`), with a budget of
    MAX_REPLY_BYTES that `_budgeted` renews before each reply."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self.left = MAX_REPLY_BYTES

    def readline(self, size: int = -1) -> bytes:
        line: bytes = self.file.readline(size)
        self.left -= len(line)
        if self.left < 0:
            raise _ReplyTooLarge(f"an SMTP reply over {CAP}, not read past it")
        return line

    def close(self) -> None:
        self.file.close()


def _budgeted(smtp: smtplib.SMTP) -> None:
    """Give the reply smtplib is about to read a fresh budget (the file is made anew after
    STARTTLS, and wrapped then)."""
    if smtp.file is None and smtp.sock is not None:
        smtp.file = smtp.sock.makefile("rb")
    if smtp.file is not None and not isinstance(smtp.file, _Budget):
        smtp.file = _Budget(smtp.file)
    if isinstance(smtp.file, _Budget):
        smtp.file.left = MAX_REPLY_BYTES


class _CappedSmtp(smtplib.SMTP):
    def getreply(self) -> tuple[int, bytes]:
        _budgeted(self)
        return super().getreply()


class _CappedSmtpSsl(smtplib.SMTP_SSL):
    def getreply(self) -> tuple[int, bytes]:
        _budgeted(self)
        return super().getreply()

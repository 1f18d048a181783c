"""Local providers: the embedded default and development sinks.

- `file://DIR` writes one `.eml` per outbox row, named by its token, atomically (a temporary file
  hard-linked into place): a second write of the same row is detected and not duplicated, so the
  sink is idempotent by construction, forever. It answers `status` from the directory. The
  messages are private: a folder it creates is 0700 and each message 0600, whatever the umask
  (`?mode=0750` lets a group read them: the files get the folder's mode without execute).
- `console:` prints each message, inert on the terminal; not idempotent (a resend prints twice).
- `null:` accepts everything instantly (benchmarks).

`file_provider`, `console_provider` and `null_provider` are the factories `registry.py` names.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.inert import printable
from oncebox.providers.base import Capabilities, Outgoing, Receipt, SendRetryable, StatusAnswer
from oncebox.providers.email import render
from oncebox.providers.email_payload import MAX_EMAIL_BYTES, check_email_payload

PRIVATE_FOLDER = 0o700


def check_folder_mode(mode: int) -> int:
    """A folder mode the outbox can work in and that keeps strangers out."""
    if mode & 0o700 != 0o700:
        raise ConfigurationError(
            f"outbox folder mode {mode:04o} must give its owner read, write and search (0700)"
        )
    if mode & 0o002 or mode & ~0o777:
        raise ConfigurationError(
            f"outbox folder mode {mode:04o} would leave the messages writable by others "
            "(or set special bits): use 0700, or 0750 for a group of readers"
        )
    return mode


class FileProvider:
    name = "file"
    idempotent = True
    idempotency_window: timedelta | None = None  # forever: the file is the record
    capabilities = Capabilities(lookup=True, check_payload=True, max_payload_bytes=MAX_EMAIL_BYTES)

    def __init__(self, directory: Path, mode: int = PRIVATE_FOLDER) -> None:
        self.directory = directory
        self.folder_mode = check_folder_mode(mode)
        self.file_mode = mode & 0o666  # the folder's read and write bits, never execute

    def path_for(self, outgoing: Outgoing) -> Path:
        return self.directory / f"{outgoing.token}.eml"

    def check_payload(self, payload: Mapping[str, Any]) -> None:
        """Refuse, when written, a message this email provider could never render."""
        check_email_payload(payload)

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        final = self.path_for(outgoing)
        message = bytes(render(outgoing))  # before any file: a refusal leaves nothing behind
        tmp = final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            self._make_folder()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.file_mode)
            with os.fdopen(fd, "wb") as handle:
                os.fchmod(handle.fileno(), self.file_mode)  # exactly, whatever the umask
                handle.write(message)
                handle.flush()
                os.fsync(handle.fileno())  # the receipt must not outlive the file
            os.link(tmp, final)
            _fsync_directory(self.directory)
        except FileExistsError:
            return Receipt(final.name, "already written: the earlier write is the delivery")
        except OSError as exc:
            raise SendRetryable(f"cannot write {final}: {exc.strerror or exc}") from None
        finally:
            tmp.unlink(missing_ok=True)
        return Receipt(final.name, str(final))

    def _make_folder(self) -> None:
        """The folder, created with its mode exactly; one that exists keeps its own."""
        for folder in reversed([self.directory, *self.directory.parents]):
            if not folder.exists():
                with contextlib.suppress(FileExistsError):  # another dispatcher, just now
                    folder.mkdir()
                    folder.chmod(self.folder_mode)

    def status(
        self, outgoing: Outgoing, idempotency_key: str
    ) -> tuple[StatusAnswer, Receipt | None]:
        final = self.path_for(outgoing)
        if final.exists():
            return "sent", Receipt(final.name, str(final))
        return "not_found", None


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ConsoleProvider:
    name = "console"
    idempotent = False
    idempotency_window: timedelta | None = None
    capabilities = Capabilities(check_payload=True, max_payload_bytes=MAX_EMAIL_BYTES)

    def check_payload(self, payload: Mapping[str, Any]) -> None:
        """Refuse, when written, a message this email provider could never render."""
        check_email_payload(payload)

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        message = render(outgoing)
        sys.stdout.write(f"--- oncebox {outgoing.channel} message {outgoing.message_id}\n")
        lines = message.as_string().splitlines()  # inert: a body cannot drive the terminal
        sys.stdout.write("".join(printable(line) + "\n" for line in lines))
        return Receipt(outgoing.message_id)


class NullProvider:
    name = "null"
    idempotent = True
    idempotency_window: timedelta | None = None
    capabilities = Capabilities()  # takes any payload (benchmarks), up to the default cap

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        return Receipt(outgoing.token)


def file_provider(url: str) -> FileProvider:
    """`file://DIR[?mode=0750]`."""
    parts = urlsplit(url)
    path = unquote(parts.netloc + parts.path) if parts.netloc else unquote(parts.path)
    if not path:
        raise ConfigurationError(f"email URL {url!r} names no directory")
    return FileProvider(Path(path), _folder_mode(url, parts.query, PRIVATE_FOLDER))


def _folder_mode(url: str, query: str, default: int) -> int:
    """`?mode=0750` of a `file://` URL, in octal, the only option it takes."""
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(options) - {"mode"})
    if unknown:
        raise ConfigurationError(f"email URL {url!r}: unknown option(s) {', '.join(unknown)}")
    text = options.get("mode")
    if text is None:
        return default
    if not (text.isascii() and text.isdigit() and set(text) <= set("01234567") and len(text) <= 4):
        raise ConfigurationError(f"email URL {url!r}: mode={text!r} is not an octal mode (0750)")
    return int(text, 8)


def console_provider(url: str) -> ConsoleProvider:
    """`console:` (whatever follows the colon)."""
    return ConsoleProvider()


def null_provider(url: str) -> NullProvider:
    """`null:` (whatever follows the colon)."""
    return NullProvider()

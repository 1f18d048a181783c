"""Local providers: the embedded default and development sinks.

- `file://DIR` writes one `.eml` per outbox row, named by its token, atomically (a temporary file
  hard-linked into place): a second write of the same row is detected and not duplicated, so the
  sink is idempotent by construction, forever. It answers `status` from the directory.
- `console:` prints each message; not idempotent (a resend prints twice).
- `null:` accepts everything instantly (benchmarks).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from oncebox.providers.base import Outgoing, Receipt, SendRetryable, StatusAnswer
from oncebox.providers.email import check_email_payload, render


class FileProvider:
    name = "file"
    idempotent = True
    idempotency_window: timedelta | None = None  # forever: the file is the record

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path_for(self, outgoing: Outgoing) -> Path:
        return self.directory / f"{outgoing.token}.eml"

    def check_payload(self, payload: Mapping[str, Any]) -> None:
        """Refuse, when written, a message this email provider could never render."""
        check_email_payload(payload)

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        final = self.path_for(outgoing)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = final.with_name(f".{final.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            with tmp.open("wb") as handle:
                handle.write(bytes(render(outgoing)))
                handle.flush()
                os.fsync(handle.fileno())  # the receipt must not outlive the file
            try:
                os.link(tmp, final)
                _fsync_directory(self.directory)
            except FileExistsError:
                return Receipt(final.name, "already written: the earlier write is the delivery")
            finally:
                tmp.unlink(missing_ok=True)
        except OSError as exc:
            raise SendRetryable(f"cannot write {final}: {exc.strerror or exc}") from None
        return Receipt(final.name, str(final))

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

    def check_payload(self, payload: Mapping[str, Any]) -> None:
        """Refuse, when written, a message this email provider could never render."""
        check_email_payload(payload)

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        message = render(outgoing)
        sys.stdout.write(f"--- oncebox {outgoing.channel} message {outgoing.message_id}\n")
        sys.stdout.write(message.as_string())
        sys.stdout.write("\n")
        return Receipt(outgoing.message_id)


class NullProvider:
    name = "null"
    idempotent = True
    idempotency_window: timedelta | None = None

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        return Receipt(outgoing.token)

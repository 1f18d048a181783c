"""A provider wrapper that writes every send into the run's history before and after it."""

from __future__ import annotations

from datetime import timedelta

from oncebox.chaos.history import HistoryWriter
from oncebox.providers.base import (
    Capabilities,
    Outgoing,
    Provider,
    Receipt,
    SendAmbiguous,
    SendError,
    as_closing,
    capabilities_of,
)


class RecordingProvider:
    """Forwards to the real provider; `invoke` is on disk before the request leaves, so a
    process killed mid-send leaves an operation whose outcome the checker treats as unknown."""

    def __init__(self, inner: Provider, history: HistoryWriter) -> None:
        self.inner = inner
        self.history = history
        self.name: str = inner.name
        self.idempotent: bool = inner.idempotent
        self.idempotency_window: timedelta | None = inner.idempotency_window

    @property
    def capabilities(self) -> Capabilities:
        """`send` and `close` only: a batch, a lookup or a check would pass the history by."""
        return Capabilities(
            close=True, max_payload_bytes=capabilities_of(self.inner).max_payload_bytes
        )

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        self.history.write("send", "invoke", outgoing.token, f"attempt {outgoing.attempt}")
        try:
            receipt = self.inner.send(outgoing, idempotency_key)
        except SendAmbiguous as exc:
            self.history.write("send", "unknown", outgoing.token, exc.reason)
            raise
        except SendError as exc:
            self.history.write("send", "fail", outgoing.token, f"{type(exc).__name__}: {exc}")
            raise
        except BaseException as exc:
            self.history.write("send", "unknown", outgoing.token, f"{type(exc).__name__}: {exc}")
            raise
        self.history.write("send", "ok", outgoing.token, receipt.provider_id or "")
        return receipt

    def close(self) -> None:
        inner = as_closing(self.inner)
        if inner is not None:
            inner.close()
        self.history.close()

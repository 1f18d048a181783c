"""Faults the demo injects around the embedded file sink, so a laptop run shows what production
sees: a lost acknowledgement (the file is written, the answer is lost) and a 429 burst (the
provider throttles the channel). Against a real provider (`--email`), these are skipped: a real
provider's faults are its own."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from oncebox.providers import (
    Capabilities,
    Outgoing,
    Provider,
    Receipt,
    SendAmbiguous,
    SendThrottled,
)
from oncebox.providers.base import as_payload_check, capabilities_of


class FaultyFileSink:
    """Wraps the file sink: the first `throttle` sends are answered 429 (Retry-After 30 s), and the
    messages of `lose_ack_tokens` are written and then reported lost, once each."""

    name = "file+faults"
    idempotent = True

    def __init__(self, inner: Provider, throttle: int, lose_ack_tokens: set[str]) -> None:
        self.inner = inner
        self.idempotency_window: timedelta | None = inner.idempotency_window
        self.throttle_left = throttle
        self.lose_ack = set(lose_ack_tokens)
        self.duplicates_detected = 0
        self.injected = {"throttled": 0, "lost_acks": 0}
        self._lock = threading.Lock()

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            check_payload=True, max_payload_bytes=capabilities_of(self.inner).max_payload_bytes
        )

    def check_payload(self, payload: Mapping[str, Any]) -> None:
        inner = as_payload_check(self.inner)
        if inner is not None:
            inner.check_payload(payload)

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        with self._lock:
            if self.throttle_left > 0:
                self.throttle_left -= 1
                self.injected["throttled"] += 1
                raise SendThrottled("429 Too Many Requests (demo burst)", timedelta(seconds=30))
            lose = outgoing.token in self.lose_ack
            self.lose_ack.discard(outgoing.token)
        receipt = self.inner.send(outgoing, idempotency_key)
        with self._lock:
            if "already written" in receipt.detail:
                self.duplicates_detected += 1
            if lose:
                self.injected["lost_acks"] += 1
        if lose:
            raise SendAmbiguous("the sink wrote the message, then the acknowledgement was lost")
        return receipt

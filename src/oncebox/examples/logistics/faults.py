"""Faults the demo injects around the embedded file sink, so a laptop run shows what production
sees: a lost acknowledgement (the file is written, the answer is lost) and a 429 burst (the
provider throttles the channel). Against a real provider (`--email`), these are skipped: a real
provider's faults are its own."""

from __future__ import annotations

import threading
from datetime import timedelta

from oncebox.providers import Outgoing, Provider, Receipt, SendAmbiguous, SendThrottled


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

    def check_payload(self, payload: object) -> None:
        check = getattr(self.inner, "check_payload", None)
        if callable(check):
            check(payload)

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

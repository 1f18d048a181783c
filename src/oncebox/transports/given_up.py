"""Messages a broker stopped delivering, made oncebox dead letters where an operator looks.

A broker delivers again a message its consumer never settled: the consumer died, froze, or held
it past its lease. A message that takes down every worker that runs it (a handler that exhausts
memory or crashes the interpreter) would be delivered for ever, a worker lost each time, while
its job waited `relayed` and looked merely slow. So the broker stops after `max_deliveries`
(SQS's redrive policy, JetStream's `MaxDeliver`) and sets the message aside where nothing but
this sweep reads it (SQS: `oncebox-Q-redriven`; JetStream: the `MAX_DELIVERIES` advisories its
`_GIVEN_UP` stream keeps). Each worker sweeps the broker-held queues it serves on its rescuer's
pass:

- a relayed job's message: the job's row turns `dead`, fenced on the attempt the message
  carried, with the reason — in `dlq list` under its key (SQS mints message ids of its own; the
  job's id travels in the body), replayable like any dead job. A copy that lost its race (the
  job moved on) buries nothing;
- an unrecorded message (no row): moved to the queue's dead letters with the reason;
- then the message is removed from the broker. A sweep killed in between finds it again next
  pass: the row's fence makes the second burial a no-op.

RabbitMQ's quorum queues dead-letter by themselves at their own delivery limit (`.dead`); its
wire has no set-aside place to sweep, and is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from oncebox.brokers.messages import GivenUp, Received
from oncebox.errors import BrokerRefused, BrokerUnavailable
from oncebox.store.base import RelayedFinish, Store
from oncebox.transports.broker import parse_message

log = logging.getLogger("oncebox.transports")
ERROR = "x-oncebox-error"


def reason(given: GivenUp, broker: str) -> str:
    return (
        f"{broker} gave it up after {given.deliveries} deliveries, none settled: a handler "
        "that takes its worker down, or workers that keep dying or outrunning their lease"
    )


class GivenUpSweep:
    """The broker-held queues a worker serves (`queue` → its broker's URL), swept each pass."""

    def __init__(
        self,
        store: Store,
        brokers: Mapping[str, str],
        wire_for: Callable[[str, str], Any],
        now: Callable[[], datetime],
        *,
        worker: str = "",
        batch: int = 100,
    ) -> None:
        self.store = store
        self.brokers = dict(brokers)
        self._wire_for = wire_for
        self._now = now
        self._worker = worker
        self._batch = batch
        self._wires: dict[str, Any] = {}

    def run_once(self) -> int:
        """Sweep every queue once; how many messages were made dead letters. A broker away or
        refusing is logged and left for the next pass."""
        buried = 0
        for queue, url in self.brokers.items():
            try:
                buried += self._sweep(queue, url)
            except (BrokerUnavailable, BrokerRefused) as exc:
                log.warning("%s: what its broker gave up on is swept next pass (%s)", queue, exc)
        return buried

    def _wire(self, queue: str, url: str) -> Any:
        if queue not in self._wires:
            wire = self._wire_for(url, queue)
            wire.declare()
            self._wires[queue] = wire
        return self._wires[queue]

    def _sweep(self, queue: str, url: str) -> int:
        wire = self._wire(queue, url)
        if not hasattr(wire, "given_up"):
            return 0
        given = wire.given_up(self._batch)
        kind = url.split(":", 1)[0].upper()
        relayed: list[tuple[GivenUp, RelayedFinish]] = []
        unrecorded: list[tuple[GivenUp, str]] = []
        for one in given:
            try:
                parsed = parse_message(Received(one.message, "", True))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                unrecorded.append((one, f"not an oncebox message: {exc!r}"))
                continue
            why = reason(one, kind)
            if isinstance(parsed, tuple):
                unrecorded.append((one, why))
                continue
            finish = RelayedFinish(
                id=parsed.job,
                run=parsed.run,
                state="dead",
                outcome=None,
                delay=timedelta(0),
                error=why,
                worker=self._worker,
                started_at=self._now(),
            )
            relayed.append((one, finish))
        dead = self.store.job_bury_relayed([f for _g, f in relayed]) if relayed else set()
        for one, finish in relayed:
            wire.bury(one, None)
            if finish.id in dead:
                log.warning("%s: job %s dead: %s", queue, finish.id, finish.error)
        for one, why in unrecorded:
            wire.bury(one, {ERROR: why[:4000]})
            message_id = one.message.message_id
            log.warning("%s: message %s to the dead letters: %s", queue, message_id, why)
        return len(dead) + len(unrecorded)

    def close(self) -> None:
        wires, self._wires = self._wires, {}
        for wire in wires.values():
            wire.close()

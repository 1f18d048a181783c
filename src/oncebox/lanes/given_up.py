"""Messages a broker stopped delivering, made oncebox dead letters where an operator looks.

A broker delivers again a message its consumer never settled: the consumer died, froze, or held
it past its lease. A message that takes down every worker that runs it (a handler that exhausts
memory or crashes the interpreter) would be delivered for ever, a worker lost each time, while
its job waited `relayed` and looked merely slow. So the broker stops after `max_deliveries`
(SQS's redrive policy, JetStream's `MaxDeliver`, RabbitMQ's quorum-queue delivery limit) and
sets the message aside where nothing but this sweep reads it (SQS: `oncebox-Q-redriven`;
JetStream: the `MAX_DELIVERIES` advisories its `_GIVEN_UP` stream keeps; RabbitMQ: the queue
`oncebox.Q.given-up` it dead-letters to). Each worker sweeps the broker-held queues it serves, on
a lane of its own (a slow broker delays nothing else):

- a relayed job's message: the job's row turns `dead`, fenced on the attempt the message
  carried, with the reason — in `dlq list` under its key (SQS mints message ids of its own; the
  job's id travels in the body), replayable like any dead job. A copy that lost its race (the
  job moved on) buries nothing; a consumer still running it, past its lease, finds its own
  settlement fenced off and rolled back;
- an unrecorded message (no row), or any message on a store that keeps no rows (SQLite): moved
  to the queue's dead letters with the reason;
- then the message is removed from the broker. A sweep killed in between finds it again next
  pass: the row's fence makes the second burial a no-op (an unrecorded message may then reach
  the dead letters twice).

A delivery handed back unrun (a worker stopping) is not one that took a worker down, and is not
counted as one where a copy is the same message (`brokers/transport.py`): the reason below says
so only where the count may hold such deliveries — SQS and JetStream count an unrecorded
message's every delivery, and a release after a delay.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from oncebox.brokers.brokered import broker_kind
from oncebox.brokers.messages import GivenUp, Received
from oncebox.brokers.transport import parse_message
from oncebox.jobs import transitions
from oncebox.kernel.errors import (
    BrokerRefused,
    BrokerUnavailable,
    ConfigurationError,
    StoreUnavailable,
)
from oncebox.lanes.lane import run_forever
from oncebox.store.params import RelayedFinish
from oncebox.store.protocol import Store

log = logging.getLogger("oncebox.transports")
ERROR = "x-oncebox-error"
SWEPT = ("sqs", "nats", "rabbitmq")  # the brokers that set a message aside for a sweep
SHOWN = {"sqs": "SQS", "nats": "JetStream", "rabbitmq": "RabbitMQ"}


def reason(given: GivenUp, kind: str, *, recorded: bool) -> str:
    """Why a message is dead: the deliveries its broker counted, and what they can have been
    (a delivery handed back unrun is counted only where the module docstring says)."""
    shown = SHOWN.get(kind, kind)
    said = (
        f"{shown} gave it up after {given.deliveries} deliveries, none settled: a handler "
        "that takes its worker down, or workers that keep dying or outrunning their lease"
    )
    if kind == "rabbitmq":
        return said
    unrun = "its claim waiting too long for its key's lock"
    if not recorded:
        unrun = f"its worker stopping, or {unrun}"
    return f"{said}; {shown} also counts each delivery handed back unrun ({unrun})"


@dataclass(frozen=True)
class GivenUpSweepConfig:
    interval: timedelta = timedelta(seconds=15)
    batch_size: int = 100  # per queue and pass

    def __post_init__(self) -> None:
        if self.interval <= timedelta(0) or self.batch_size < 1:
            raise ConfigurationError("the given-up sweep needs a positive interval and batch")


@dataclass(frozen=True)
class GivenUpSweepResult:
    dead_jobs: int = 0  # relayed jobs made dead
    dead_letters: int = 0  # unrecorded messages moved to the dead letters
    unswept: tuple[str, ...] = ()  # queues whose broker or store could not be reached


class GivenUpSweep:
    """The broker-held queues a worker serves (`queue` → its broker's URL), swept each pass."""

    def __init__(
        self,
        store: Store,
        brokers: Mapping[str, str],
        wire_for: Callable[[str, str], Any],
        config: GivenUpSweepConfig | None = None,
        *,
        worker: str = "",
    ) -> None:
        self.store = store
        self.brokers = {q: url for q, url in brokers.items() if broker_kind(url) in SWEPT}
        self.config = config or GivenUpSweepConfig()
        self._wire_for = wire_for
        self._worker = worker
        self._wires: dict[str, Any] = {}

    def run_once(self) -> GivenUpSweepResult:
        """Sweep every queue once. A broker or store away, or a queue that fails otherwise, is
        logged and left for the next pass; the others are swept regardless."""
        dead_jobs = dead_letters = 0
        unswept: list[str] = []
        for queue, url in self.brokers.items():
            try:
                jobs, letters = self._sweep(queue, url)
            except (BrokerUnavailable, BrokerRefused, StoreUnavailable) as exc:
                log.warning("%s: what its broker gave up on is swept next pass (%s)", queue, exc)
                unswept.append(queue)
                continue
            except Exception:  # a bug must not stop the other queues' sweep
                log.exception("%s: the given-up sweep failed; trying again next pass", queue)
                unswept.append(queue)
                continue
            dead_jobs += jobs
            dead_letters += letters
        return GivenUpSweepResult(dead_jobs, dead_letters, tuple(unswept))

    def run_forever(self, stop: threading.Event) -> None:
        def once() -> bool:
            result = self.run_once()
            return result.dead_jobs + result.dead_letters >= self.config.batch_size

        run_forever("given-up sweep", once, stop, self.config.interval.total_seconds())

    def _wire(self, queue: str, url: str) -> Any:
        if queue not in self._wires:
            wire = self._wire_for(url, queue)
            try:
                wire.declare()
            except BaseException:
                wire.close()
                raise
            self._wires[queue] = wire
        return self._wires[queue]

    def _sweep(self, queue: str, url: str) -> tuple[int, int]:
        wire = self._wire(queue, url)
        kind = broker_kind(url)
        relayed: list[tuple[GivenUp, RelayedFinish]] = []
        unrecorded: list[tuple[GivenUp, str]] = []
        given = wire.given_up(self.config.batch_size)
        now = self.store.clock_now() if given and self.store.dialect == "postgres" else None
        for one in given:
            try:
                parsed = parse_message(Received(one.message, "", True))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                unrecorded.append((one, f"not an oncebox message: {exc!r}"))
                continue
            if isinstance(parsed, tuple) or now is None:
                unrecorded.append((one, reason(one, kind, recorded=False)))
                continue
            buried = transitions.dead(reason(one, kind, recorded=True))
            finish = RelayedFinish(
                id=parsed.job,
                run=parsed.run,
                state=buried.state,
                outcome=buried.outcome,
                delay=buried.delay,
                error=buried.error,
                worker=self._worker,
                started_at=now,
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
        return len(dead), len(unrecorded)

    def close(self) -> None:
        wires, self._wires = self._wires, {}
        for wire in wires.values():
            wire.close()

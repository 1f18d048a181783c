"""A broker's queue as a transport: deliveries in, the broker told after the commit.

Whichever broker holds the queue (its wire: `brokers/`), two kinds of message arrive, told apart
by their body:

- **a job's publish** (`{"job": id, "run": n, "task": ..., "args": ..., "group": ...}`, the group
  only for a job of one), written by the relay
  (migration 0016: the job is `relayed` in the store, and the outbox dispatcher publishes each
  attempt). Before anything runs, the batch's rows are read in one statement: a message is
  current when its job is still relayed at attempt n - 1. Any other copy lost a race — a lost
  acknowledgement, a duplicate publish, a cancel, an earlier attempt already settled — and is
  acknowledged unrun (a copy of a done job counted as a claim conflict, the rest as
  `deliveries_stale`). A current one runs with the job's stored key and is settled in the
  consumer's transaction, fenced on its attempt (`job_settle_relayed`): of two copies running
  at once only the first to commit settles; the other's transaction is rolled back and its
  message given back, to be found stale. A retry is the row moved to its next attempt, due
  later: the relay publishes it then. Nothing but an acknowledgement is sent after the commit.
- **a message published straight to the broker** (`publish_unrecorded`: `{"task", "args"}`, its
  attempt in the header `x-oncebox-attempt`), with no job record. The consumer renders its key
  from the arguments and claims it, and only after the commit tells the broker how it ended:
  done (completed, or a duplicate the claim absorbed) acknowledged; retry published again,
  attempt + 1, to wait its backoff (`Wire.retry`), then acknowledged; dead published to the
  dead letters with the error, then acknowledged.

Either way, a delivery released (a shutdown, a claim that waited too long) returns to the queue,
and a consumer that dies after its commit and before its acknowledgement leaves the message with
the broker, which delivers it again: the job's row (recorded) or the claim (unrecorded) absorbs
it — the lost-ack window the key exists for.

A broker counts the deliveries it made of a message and gives up after its limit (SQS's
`max_deliveries`, JetStream's `MaxDeliver`, RabbitMQ's delivery limit: `lanes/given_up.py`
makes each a dead letter): a count of the workers it took down. A delivery handed back unrun —
the worker is stopping, a limit's slot is wanted elsewhere — took no worker down, so it is
handed back as a copy, the original acknowledged: the broker sees a new message, and no delivery
spent. That is the same message to its consumer wherever its attempt is not the broker's count:
any message on RabbitMQ (the attempt in a header), a relayed job's publish anywhere (the attempt
in its body). An unrecorded message on SQS or JetStream, whose attempt is the delivery count, is
made deliverable again instead, and that delivery counts; so does a release after a delay there
(SQS's visibility, a delayed negative acknowledgement). A delivery dropped (the store went away
mid-batch, its settlement refused) is given back as a failed one, counted.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from oncebox.brokers.messages import Message, Received
from oncebox.jobs.codec import encode_args
from oncebox.jobs.tasks import Task
from oncebox.kernel.counters import settlement_counts
from oncebox.kernel.errors import (
    BrokerRefused,
    BrokerUnavailable,
    ConfigurationError,
    OnceboxError,
    StoreUnavailable,
)
from oncebox.queue.transport import Delivery, Settlement
from oncebox.store.params import RelayedFinish
from oncebox.store.protocol import ConsumerTx, Store

ATTEMPT = "x-oncebox-attempt"
LOOK_AGAIN_S = 0.001  # an idle lane's wait between fetches: each fetch is itself a long poll
log = logging.getLogger("oncebox.transports")


def task_message(task: Task, args: Mapping[str, Any], max_bytes: int, attempt: int = 1) -> Message:
    """A message for `task` with `args`, checked as an enqueue checks them."""
    task.check_args(args)
    body = {"task": task.name, "args": json.loads(encode_args(args, task.name, max_bytes))}
    return Message(
        json.dumps(body, separators=(",", ":")).encode(), uuid.uuid4().hex, {ATTEMPT: attempt}
    )


@dataclass(frozen=True, slots=True)
class _Relayed:
    """A job's publish, as the relay wrote it (0016)."""

    job: int
    run: int
    task: str
    args_json: str


def parse_message(one: Received) -> _Relayed | tuple[str, str, int]:
    """A relayed job's publish, or an unrecorded message's (task, args, attempt); raises on
    anything else."""
    body = json.loads(one.message.body)
    task, args = str(body["task"]), body["args"]
    if not isinstance(args, dict):
        raise ValueError("args must be an object")
    args_json = json.dumps(args, separators=(",", ":"))
    if "job" in body:
        job, run = body["job"], body["run"]
        if type(job) is not int or type(run) is not int or run < 1:
            raise ValueError("job and run must be integers, run at least 1")
        return _Relayed(job, run, task, args_json)
    attempt = int(one.message.headers.get(ATTEMPT, 1))
    if attempt < 1:
        raise ValueError("the attempt must be at least 1")
    return task, args_json, attempt


class Wire(Protocol):
    """What a transport needs of a broker's queue (`brokers/`): one lane's connection."""

    name: str
    attempt_is_delivery_count: bool  # an unrecorded message's attempt: the broker's count?

    def receive(self, limit: int) -> list[Received]: ...
    def publish(self, messages: Sequence[Message]) -> None: ...
    def ack(self, received: Sequence[Received]) -> None: ...
    def give_back(self, received: Sequence[Received]) -> None: ...
    def hand_back(self, received: Sequence[Received]) -> None: ...
    def retry(self, received: Received, delay_ms: float, headers: Mapping[str, Any]) -> object: ...
    def dead(self, received: Received, headers: Mapping[str, Any]) -> None: ...
    def close(self) -> None: ...


class BrokerTransport:
    """One consumer lane's connection to a broker's queue."""

    long_polls = True  # a fetch waits for messages itself (the worker's `_poll`)

    def __init__(
        self,
        queue: Wire,
        *,
        attempts: Callable[[str], int],
        now: Callable[[], datetime],
        store: Store | None = None,
        worker: str = "",
    ) -> None:
        self.queue = queue
        self._attempts = attempts  # a task's max_attempts
        self._now = now
        self._store = store  # the job records of relayed messages (None: unrecorded only)
        self._worker = worker
        self._held: dict[str, Received] = {}
        self._lock = threading.Lock()

    def publish_unrecorded(self, messages: Sequence[Message]) -> None:
        """Publish straight to the broker, confirmed — with no job record in the store: what
        `jobs`, `status` and `dlq` show does not include these."""
        self.queue.publish(messages)

    def fetch(self, limit: int) -> list[Delivery]:
        # the store's clock first: while the store is away nothing is received — each receive
        # spends one of a message's deliveries (SQS's and JetStream's `max_deliveries`), and a
        # lane retrying through an outage would otherwise spend them all
        now = self._now()
        received = self.queue.receive(limit)
        deliveries: list[Delivery] = []
        relayed: list[tuple[Received, _Relayed]] = []
        for one in received:
            try:
                parsed = parse_message(one)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                # not a message of ours: to the dead letters now, or it would come back first
                # after every reconnect
                error = {"x-oncebox-error": f"not an oncebox message: {exc!r}"[:4000]}
                self._quietly(self.queue.dead, one, error)
                continue
            if isinstance(parsed, _Relayed):
                relayed.append((one, parsed))
                continue
            task, args_json, attempt = parsed
            deliveries.append(
                self._hold(
                    one,
                    task=task,
                    args_json=args_json,
                    key=None,
                    attempt=attempt,
                    attempts_left=max(0, self._attempts_of(task) - attempt),
                    leased_at=now,
                )
            )
        if relayed:
            try:
                deliveries += self._current(relayed, now)
            except StoreUnavailable:
                for delivery in deliveries:  # left to the broker, whose hold runs out
                    self._take(delivery)
                raise
        return deliveries

    def _current(self, relayed: list[tuple[Received, _Relayed]], now: datetime) -> list[Delivery]:
        """The relayed messages whose job is still waiting for that attempt, as deliveries; the
        other copies acknowledged unrun and counted."""
        if self._store is None:
            raise ConfigurationError(
                f"queue {self.queue.name!r} holds a job's publish, and this consumer has no "
                "store to settle it in"
            )
        rows = self._store.job_relay_check(sorted({message.job for _one, message in relayed}))
        current: list[Delivery] = []
        stale: list[Received] = []
        counts = {"claim_conflicts": 0, "deliveries_stale": 0}
        for one, message in relayed:
            row = rows.get(message.job)
            if row is None or row.state != "relayed" or row.attempt != message.run - 1:
                stale.append(one)
                done = row is not None and row.state == "done"
                counts["claim_conflicts" if done else "deliveries_stale"] += 1
                continue
            rows.pop(message.job)  # a second copy in this batch is stale: one runs
            current.append(
                self._hold(
                    one,
                    task=message.task,
                    args_json=message.args_json,
                    key=row.key,
                    attempt=message.run,
                    attempts_left=max(0, row.max_attempts - (message.run - row.attempt_base)),
                    leased_at=now,
                    expires_at=row.expires_at,
                    job_id=row.id,
                    trace_context=row.trace_context,
                )
            )
        if stale:
            self._store.counter_add(counts)
            self._settle_stale(stale)
            log.info(
                "%s: acknowledged %d stale cop%s of relayed jobs unrun (settled, cancelled or "
                "already moved on)",
                self.queue.name,
                len(stale),
                "y" if len(stale) == 1 else "ies",
            )
        return current

    def _settle_stale(self, stale: list[Received]) -> None:
        """Copies that lost their race are done with: acknowledged, never given back (they
        would come back first, for ever)."""
        self._quietly(self.queue.ack, stale)

    def _hold(self, one: Received, **fields: Any) -> Delivery:
        message_id = f"{one.message.message_id}#{one.channel}.{one.tag}"
        with self._lock:
            self._held[message_id] = one
        return Delivery(message_id=message_id, **fields)

    def _attempts_of(self, task: str) -> int:
        """The task's attempts; a task this worker does not know gets the consumer's verdict
        (dead, named) on its first."""
        try:
            return self._attempts(task)
        except OnceboxError:
            return 1

    def settle_in_transaction(self, tx: ConsumerTx, settlements: Sequence[Settlement]) -> set[str]:
        """Relayed jobs: their rows, fenced on the attempt delivered. Unrecorded messages have
        no rows: their outcomes are counted in the consumer's transaction."""
        recorded = [s for s in settlements if s.delivery.job_id is not None]
        unrecorded = [s for s in settlements if s.delivery.job_id is None]
        settled = {s.delivery.message_id for s in unrecorded}
        tx.counter_add(settlement_counts((s.state, s.outcome) for s in unrecorded))
        if recorded:
            ids = tx.job_settle_relayed(
                [
                    RelayedFinish(
                        id=s.delivery.job_id or 0,
                        run=s.delivery.attempt,
                        state=s.state,
                        outcome=s.outcome,
                        delay=s.delay,
                        error=s.error,
                        worker=self._worker,
                        started_at=s.delivery.leased_at,
                    )
                    for s in recorded
                ]
            )
            settled.update(s.delivery.message_id for s in recorded if s.delivery.job_id in ids)
        return settled

    def after_commit(self, settlements: Sequence[Settlement]) -> None:
        """Tell the broker how each ended. Never raises: the transaction committed, and a
        message the broker could not be told about is delivered again — a relayed job's row, or
        an unrecorded message's claim, absorbs it (an unrecorded retry's or dead letter's copy
        may be doubled: failed attempts hold no claim)."""
        for settlement in settlements:
            received = self._take(settlement.delivery)
            if received is None:
                continue
            if settlement.state == "done" or settlement.delivery.job_id is not None:
                # a relayed job's retry is its row's next attempt, which the relay publishes
                self._quietly(self.queue.ack, [received])
            elif settlement.state == "ready":
                delay_ms = settlement.delay / timedelta(milliseconds=1)
                headers = {ATTEMPT: settlement.delivery.attempt + 1}
                self._quietly(self.queue.retry, received, delay_ms, headers)
            else:
                error = {"x-oncebox-error": (settlement.error or "dead")[:4000]}
                self._quietly(self.queue.dead, received, error)

    def release(self, deliveries: Sequence[Delivery], delay: timedelta) -> None:
        """Give deliveries back unrun, the attempt not spent: after at least `delay` (the
        wire's retry), or at once — handed back as a copy where that is the same message, so
        no delivery is spent either (see the module docstring)."""
        for delivery in deliveries:
            received = self._take(delivery)
            if received is None:
                continue
            if delay > timedelta(0):
                attempt = int(received.message.headers.get(ATTEMPT, 1))
                wait_ms = delay / timedelta(milliseconds=1)
                self._quietly(self.queue.retry, received, wait_ms, {ATTEMPT: attempt})
            elif delivery.job_id is not None or not self.queue.attempt_is_delivery_count:
                self._quietly(self.queue.hand_back, [received])
            else:
                self._quietly(self.queue.give_back, [received])

    def drop(self, deliveries: Sequence[Delivery]) -> None:
        """Back to the queue for whoever takes it next, as a failed delivery the broker counts
        (it would otherwise hold them until this connection closes or their visibility runs
        out)."""
        for received in filter(None, map(self._take, deliveries)):
            self._quietly(self.queue.give_back, [received])

    def _quietly(self, call: Callable[..., object], *args: Any) -> None:
        """A broker call after the commit: when the broker is away or refuses, the message is
        left to it (delivered again once the channel closes), and the log says so."""
        try:
            call(*args)
        except (BrokerUnavailable, BrokerRefused) as exc:
            log.warning("%s: left to the broker, which delivers it again", exc)

    def keep_alive(self, hold_for: timedelta) -> None:
        """Keep holding what this lane holds for `hold_for` more, on a broker whose hold runs
        out by itself (SQS's visibility timeout); nothing to send where the hold lasts while the
        connection does (RabbitMQ)."""
        extend = getattr(self.queue, "extend", None)
        if extend is None:
            return
        with self._lock:
            held = list(self._held.values())
        if held:
            self._quietly(extend, held, hold_for.total_seconds())

    def held_tokens(self) -> list[str]:
        """No lease tokens in the store: the broker holds an unacknowledged message and
        delivers it again when this consumer is gone."""
        return []

    def next_due_in(self) -> float | None:
        """Look again at once: the fetch itself waited for messages (a long poll)."""
        return LOOK_AGAIN_S

    def can_probe(self) -> bool:
        return False

    def close(self) -> None:
        """What the prefetch brought and this lane never took is handed back unrun (RabbitMQ:
        closed with the connection, it would return as counted deliveries); then closed."""
        hand_back = getattr(self.queue, "hand_back_prefetched", None)
        if hand_back is not None:
            self._quietly(hand_back)
        self.queue.close()

    def _take(self, delivery: Delivery) -> Received | None:
        with self._lock:
            return self._held.pop(delivery.message_id, None)

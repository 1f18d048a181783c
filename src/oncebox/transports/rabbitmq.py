"""The consumer's side of a RabbitMQ queue: deliveries in, acknowledgements after the commit.

A message is a task and its arguments (JSON), with its attempt in the header
`x-oncebox-attempt`. The consumer renders its key from the arguments and claims it in its
transaction, as for any broker delivery (`queue/transport.py`); only after that transaction
committed does this transport tell RabbitMQ how each delivery ended:

- done (completed, or a duplicate the claim absorbed): acknowledged;
- retry: published again, attempt + 1, to the rung of the retry ladder its backoff asks for,
  then acknowledged (`RabbitQueue.retry`);
- dead: published to the dead letters with the error and the attempt, then acknowledged;
- given back (shutdown, a claim that waited too long): returned to the queue at once.

A consumer that dies after its commit and before its acknowledgement leaves the message with
the broker, which delivers it again: the claim absorbs it (counted as a claim conflict) — the
lost-ack window the key exists for. Settlements are counted in the consumer's transaction, as
the table queue's are.

This is the transport for messages published straight to the broker (`publish_unrecorded`: no
job record in the store). Broker-backed jobs with a record — enqueued in the caller's
transaction and relayed — build on it.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from oncebox.brokers.rabbitmq import Message, RabbitQueue, Received
from oncebox.counters import settlement_counts
from oncebox.errors import BrokerRefused, BrokerUnavailable, OnceboxError
from oncebox.jobs.codec import encode_args
from oncebox.jobs.tasks import Task
from oncebox.queue.transport import Delivery, Settlement
from oncebox.store.base import ConsumerTx

ATTEMPT = "x-oncebox-attempt"
LOOK_AGAIN_S = 0.001  # an idle lane's wait between fetches: each fetch is itself a long poll
log = logging.getLogger("oncebox.transports.rabbitmq")


def task_message(task: Task, args: Mapping[str, Any], max_bytes: int, attempt: int = 1) -> Message:
    """A message for `task` with `args`, checked as an enqueue checks them."""
    task.check_args(args)
    body = {"task": task.name, "args": json.loads(encode_args(args, task.name, max_bytes))}
    return Message(
        json.dumps(body, separators=(",", ":")).encode(), uuid.uuid4().hex, {ATTEMPT: attempt}
    )


class RabbitTransport:
    """One consumer lane's RabbitMQ connection (pika's are one thread's each)."""

    long_polls = True  # a fetch waits for messages itself (the worker's `_poll`)

    def __init__(
        self,
        queue: RabbitQueue,
        *,
        attempts: Callable[[str], int],
        now: Callable[[], datetime],
    ) -> None:
        self.queue = queue
        self._attempts = attempts  # a task's max_attempts
        self._now = now
        self._held: dict[str, Received] = {}
        self._lock = threading.Lock()

    def publish_unrecorded(self, messages: Sequence[Message]) -> None:
        """Publish straight to the broker, confirmed — with no job record in the store: what
        `jobs`, `status` and `dlq` show does not include these."""
        self.queue.publish(messages)

    def fetch(self, limit: int) -> list[Delivery]:
        received = self.queue.receive(limit)
        now = self._now()
        deliveries = []
        for one in received:
            try:
                body = json.loads(one.message.body)
                task, args = str(body["task"]), body["args"]
                attempt = int(one.message.headers.get(ATTEMPT, 1))
                if not isinstance(args, dict) or attempt < 1:
                    raise ValueError("args must be an object and the attempt at least 1")
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                # not a message of ours: to the dead letters now, or it would come back first
                # after every reconnect
                error = {"x-oncebox-error": f"not an oncebox message: {exc!r}"[:4000]}
                self._quietly(self.queue.dead, one, error)
                continue
            message_id = f"{one.message.message_id}#{one.channel}.{one.tag}"
            with self._lock:
                self._held[message_id] = one
            deliveries.append(
                Delivery(
                    message_id=message_id,
                    task=task,
                    args_json=json.dumps(args, separators=(",", ":")),
                    key=None,
                    attempt=attempt,
                    attempts_left=max(0, self._attempts_of(task) - attempt),
                    leased_at=now,
                )
            )
        return deliveries

    def _attempts_of(self, task: str) -> int:
        """The task's attempts; a task this worker does not know gets the consumer's verdict
        (dead, named) on its first."""
        try:
            return self._attempts(task)
        except OnceboxError:
            return 1

    def settle_in_transaction(self, tx: ConsumerTx, settlements: Sequence[Settlement]) -> set[str]:
        """No job rows to settle: the outcomes are counted in the consumer's transaction."""
        tx.counter_add(settlement_counts((s.state, s.outcome) for s in settlements))
        return {s.delivery.message_id for s in settlements}

    def after_commit(self, settlements: Sequence[Settlement]) -> None:
        """Tell the broker how each ended. Never raises: the transaction committed, and a
        message the broker could not be told about is delivered again — the claim absorbs it
        (a retry's or dead letter's copy may be doubled: failed attempts hold no claim)."""
        for settlement in settlements:
            received = self._take(settlement.delivery)
            if received is None:
                continue
            if settlement.state == "done":
                self._quietly(self.queue.ack, [received])
            elif settlement.state == "ready":
                delay_ms = settlement.delay / timedelta(milliseconds=1)
                headers = {ATTEMPT: settlement.delivery.attempt + 1}
                self._quietly(self.queue.retry, received, delay_ms, headers)
            else:
                error = {"x-oncebox-error": (settlement.error or "dead")[:4000]}
                self._quietly(self.queue.dead, received, error)

    def release(self, deliveries: Sequence[Delivery], delay: timedelta) -> None:
        """Give deliveries back, the attempt not spent: after `delay` through the retry ladder
        (its rung at least that long), or at once."""
        for received in filter(None, map(self._take, deliveries)):
            if delay > timedelta(0):
                attempt = int(received.message.headers.get(ATTEMPT, 1))
                wait_ms = delay / timedelta(milliseconds=1)
                self._quietly(self.queue.retry, received, wait_ms, {ATTEMPT: attempt})
            else:
                self._quietly(self.queue.give_back, [received])

    def drop(self, deliveries: Sequence[Delivery]) -> None:
        """Back to the queue for whoever takes it next (RabbitMQ would otherwise hold them
        until this connection closes)."""
        for received in filter(None, map(self._take, deliveries)):
            self._quietly(self.queue.give_back, [received])

    def _quietly(self, call: Callable[..., object], *args: Any) -> None:
        """A broker call after the commit: when the broker is away or refuses, the message is
        left to it (delivered again once the channel closes), and the log says so."""
        try:
            call(*args)
        except (BrokerUnavailable, BrokerRefused) as exc:
            log.warning("%s: left to the broker, which delivers it again", exc)

    def held_tokens(self) -> list[str]:
        """No lease tokens: the broker holds an unacknowledged message while the connection
        lives, and delivers it again when it dies."""
        return []

    def next_due_in(self) -> float | None:
        """Look again at once: the fetch itself waited for messages (`RabbitQueue.wait_s`)."""
        return LOOK_AGAIN_S

    def can_probe(self) -> bool:
        return False

    def close(self) -> None:
        self.queue.close()

    def _take(self, delivery: Delivery) -> Received | None:
        with self._lock:
            return self._held.pop(delivery.message_id, None)

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
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from oncebox.brokers.rabbitmq import Message, RabbitQueue, Received
from oncebox.counters import settlement_counts
from oncebox.jobs.codec import encode_args
from oncebox.jobs.tasks import Task
from oncebox.queue.transport import Delivery, Settlement
from oncebox.store.base import ConsumerTx

ATTEMPT = "x-oncebox-attempt"


def task_message(task: Task, args: Mapping[str, Any], max_bytes: int, attempt: int = 1) -> Message:
    """A message for `task` with `args`, checked as an enqueue checks them."""
    task.check_args(args)
    body = {"task": task.name, "args": json.loads(encode_args(args, task.name, max_bytes))}
    return Message(
        json.dumps(body, separators=(",", ":")).encode(), uuid.uuid4().hex, {ATTEMPT: attempt}
    )


class RabbitTransport:
    """One consumer lane's RabbitMQ connection (pika's are one thread's each)."""

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
            body = json.loads(one.message.body)
            task = str(body["task"])
            attempt = int(one.message.headers.get(ATTEMPT, 1))
            message_id = f"{one.message.message_id}#{one.tag}"
            with self._lock:
                self._held[message_id] = one
            deliveries.append(
                Delivery(
                    message_id=message_id,
                    task=task,
                    args_json=json.dumps(body["args"], separators=(",", ":")),
                    key=None,
                    attempt=attempt,
                    attempts_left=max(0, self._attempts(task) - attempt),
                    leased_at=now,
                )
            )
        return deliveries

    def settle_in_transaction(self, tx: ConsumerTx, settlements: Sequence[Settlement]) -> set[str]:
        """No job rows to settle: the outcomes are counted in the consumer's transaction."""
        tx.counter_add(settlement_counts((s.state, s.outcome) for s in settlements))
        return {s.delivery.message_id for s in settlements}

    def after_commit(self, settlements: Sequence[Settlement]) -> None:
        for settlement in settlements:
            received = self._take(settlement.delivery)
            if received is None:
                continue
            if settlement.state == "done":
                self.queue.ack([received])
            elif settlement.state == "ready":
                delay_ms = settlement.delay / timedelta(milliseconds=1)
                attempt = settlement.delivery.attempt + 1
                self.queue.retry(received, delay_ms, {ATTEMPT: attempt})
            else:
                error = settlement.error or "dead"
                self.queue.dead(received, {"x-oncebox-error": error[:4000]})

    def release(self, deliveries: Sequence[Delivery], delay: timedelta) -> None:
        """Back to the queue at once (RabbitMQ has no delayed requeue): another lane or worker
        takes it; the attempt is not spent."""
        found = [r for r in map(self._take, deliveries) if r is not None]
        self.queue.give_back(found)

    def drop(self, deliveries: Sequence[Delivery]) -> None:
        for delivery in deliveries:
            self._take(delivery)

    def held_tokens(self) -> list[str]:
        """No lease tokens: the broker holds an unacknowledged message while the connection
        lives, and delivers it again when it dies."""
        return []

    def next_due_in(self) -> float | None:
        return None

    def can_probe(self) -> bool:
        return False

    def close(self) -> None:
        self.queue.close()

    def _take(self, delivery: Delivery) -> Received | None:
        with self._lock:
            return self._held.pop(delivery.message_id, None)

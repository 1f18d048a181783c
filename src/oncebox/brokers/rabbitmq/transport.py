"""The consumer's side of a RabbitMQ queue: `BrokerTransport` (`brokers/transport.py`) on the
queue's RabbitMQ wire (`brokers/rabbitmq/wire.py`). RabbitMQ holds an unacknowledged message while
the consumer's connection lives and delivers it again when it closes; an unrecorded message's
retry waits on the queue's ladder of TTL queues, its dead letter goes to `oncebox.<queue>.dead`.
"""

from __future__ import annotations

from oncebox.brokers.rabbitmq.wire import RabbitQueue
from oncebox.brokers.transport import ATTEMPT, BrokerTransport, task_message


class RabbitTransport(BrokerTransport):
    """One consumer lane's RabbitMQ connection (pika's are one thread's each)."""

    queue: RabbitQueue


__all__ = ["ATTEMPT", "RabbitTransport", "task_message"]

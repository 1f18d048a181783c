"""What a queue a broker holds cannot promise, refused where a job would be written or consumed.

A broker delivers a queue's messages to whichever consumer asks, in its own order, and knows
nothing of the store's locks: a limit or a debounce — both enforced by the table lease and the
pending row — would not be enforced at all, so a task with either is refused on a broker-held
queue, in one line, before anything is written. A task ordered by `group_by` keeps its order
only through the relay, which publishes one job per group at a time; published unrecorded it
is refused. And the job records of a broker-held queue (the `relayed` state, the relay
trigger: migration 0016) live on PostgreSQL only.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from oncebox.brokers.messages import SQS_MAX_MESSAGE_BYTES
from oncebox.jobs.retry import Retry
from oncebox.jobs.tasks import Task
from oncebox.kernel.errors import ConfigurationError, InvalidArguments
from oncebox.kernel.extras import needs
from oncebox.outbox.channels import Channel
from oncebox.store.protocol import RELAY_NEEDS_POSTGRES

RELAY_PREFIX = "~broker."  # the relay channel of queue Q is `~broker.Q` (0016's trigger)
# A broker away for hours must not dead-letter a publish: retried for about a day, then `dead`
# (visible; `oncebox outbox replay` sends it again).
RELAY_RETRY = Retry(
    max_attempts=300, base_delay=timedelta(seconds=1), max_delay=timedelta(minutes=5)
)


def refuse_unbrokerable(task: Task, *, recorded: bool = True) -> None:
    """Raise unless `task` can live on a broker-held queue (see the module docstring). Its
    groups keep their order when its jobs are recorded (the relay publishes a group's jobs one
    at a time: migration 0016), not when published unrecorded."""
    held = f"its queue {task.queue!r} is held by a broker"
    if task.group_by is not None and not recorded:
        raise ConfigurationError(
            f"task {task.name!r} is ordered by {task.group_by!r}: published unrecorded, its "
            "jobs would reach the broker in no order; enqueue it (on PostgreSQL the relay keeps "
            "each group in order)"
        )
    if task.limits is not None:
        raise ConfigurationError(
            f"task {task.name!r} has limits, and {held}, whose consumers the store's lease "
            "does not pace; keep the task on a queue the store holds"
        )
    if task.collapse is not None:
        raise ConfigurationError(
            f"task {task.name!r} is {task.collapse.mode}d, and {held}: a pending job is joined "
            "in the store's table; keep the task on a queue the store holds"
        )


def refuse_unrecorded_store(dialect: str) -> None:
    """Raise when the store cannot record a broker-held queue's jobs (SQLite)."""
    if dialect != "postgres":
        raise ConfigurationError(RELAY_NEEDS_POSTGRES)


BROKER_SCHEMES = {"amqp": "rabbitmq", "amqps": "rabbitmq", "sqs": "sqs", "nats": "nats"}
# a relayed job's publish around its arguments: {"args":…,"job":…,"run":…,"task":…} and its
# attributes (SQS counts them): generous, so the check errs on the side of refusing early
ENVELOPE_BYTES = 1024


def broker_kind(broker: str) -> str:
    """Which broker a URL names: `rabbitmq` (amqp://, amqps://), `sqs` (sqs://REGION) or `nats`
    (nats://HOST:4222, JetStream)."""
    scheme = broker.split(":", 1)[0].lower() if isinstance(broker, str) else ""
    if scheme not in BROKER_SCHEMES:
        raise ConfigurationError(
            "a broker is a RabbitMQ URL (amqp://HOST:5672/VHOST), an SQS one (sqs://REGION) or a "
            "NATS JetStream one (nats://HOST:4222)"
        )
    return BROKER_SCHEMES[scheme]


def wire_for(broker: str, queue: str, *, prefetch: int = 100, wait_s: float = 1.0) -> Any:
    """A connection to `queue` on its broker (`brokers/`), imported only when used: each broker's
    client is an extra, named when it is missing."""
    kind = broker_kind(broker)
    with needs(kind, f"queue {queue!r} (broker {kind})"):
        if kind == "sqs":
            from oncebox.brokers.sqs.wire import SqsQueue  # noqa: PLC0415 (boto3)

            return SqsQueue(broker, queue, prefetch=prefetch, wait_s=wait_s)
        if kind == "nats":
            from oncebox.brokers.nats.wire import NatsQueue  # noqa: PLC0415 (nats-py)

            return NatsQueue(broker, queue, prefetch=prefetch, wait_s=wait_s)
        from oncebox.brokers.rabbitmq.wire import RabbitQueue  # noqa: PLC0415 (pika)

        return RabbitQueue(broker, queue, prefetch=prefetch, wait_s=wait_s)


def check_message_size(broker: str, task: Task, args_json: str) -> None:
    """Refuse, before anything is written, a job its broker would refuse for its size (SQS:
    1 MiB per message, body and attributes)."""
    if broker_kind(broker) != "sqs":
        return
    size = len(args_json.encode()) + ENVELOPE_BYTES
    if size > SQS_MAX_MESSAGE_BYTES:
        raise InvalidArguments(
            f"task {task.name!r}: its arguments ({len(args_json.encode())} bytes) and their "
            f"envelope exceed the {SQS_MAX_MESSAGE_BYTES} bytes SQS takes per message; its queue "
            f"{task.queue!r} is held by SQS"
        )


def relay_channel(
    queue: str, broker: str, wire: Callable[[str, str], Any] | None = None
) -> Channel:
    """The outbox channel that publishes the jobs of `queue` to its broker: publishes whose lost
    answer is simply sent again — the consumer finds a second copy stale and never runs it
    (`BrokerRelay`: a batch through the wire's `publish_batch`)."""
    parts = urlsplit(broker)
    query = [(name, value) for name, value in parse_qsl(parts.query) if name != "queue"]
    url = urlunsplit(parts._replace(query=urlencode([*query, ("queue", queue)])))
    from oncebox.brokers.relay import BrokerRelay  # noqa: PLC0415

    provider = BrokerRelay(url, name=f"{broker_kind(broker)}-relay", wire=wire or wire_for)
    return Channel(name=f"{RELAY_PREFIX}{queue}", provider=provider, retry=RELAY_RETRY)

"""A run's own RabbitMQ queue, for the scenarios whose digests a broker holds.

The machine's broker (`ONCEBOX_CHAOS_AMQP`, else the local server's default) is shared: each run
puts its digests on a queue of its own name and deletes it afterwards, so runs and tests never
read each other's messages. After the run, what the broker still holds is read from outside: a
message left ready or dead-lettered is a job the checker could not see in the tables alone.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from oncebox.errors import ConfigurationError

# pika logs a connection the broker closed as an error of its own; oncebox reports the outage
# itself (BrokerUnavailable, the lanes' backoff), and a chaos run causes it on purpose
logging.getLogger("pika").setLevel(logging.CRITICAL)

AMQP_ENV = "ONCEBOX_CHAOS_AMQP"
DEFAULT_AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"


def broker_url() -> str:
    """The broker the run uses, checked reachable: a scenario that needs one says so in one
    line rather than failing in a worker."""
    url = os.environ.get(AMQP_ENV, DEFAULT_AMQP)
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5672
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        raise ConfigurationError(
            f"this scenario needs RabbitMQ at {host}:{port} ({exc}); start it, or set {AMQP_ENV}"
        ) from None
    return url


@contextmanager
def run_queue(url: str) -> Iterator[str]:
    """A fresh queue name for the run's digests, its broker side declared, deleted afterwards."""
    from oncebox.brokers.rabbitmq import RabbitQueue  # noqa: PLC0415 (pika, an extra)

    name = f"chaos-{secrets.token_hex(5)}"
    wire = RabbitQueue(url, name)
    try:
        wire.declare()
        yield name
    finally:
        try:
            wire.delete()
        finally:
            wire.close()


def left_in_broker(url: str, queue: str) -> dict[str, int]:
    """What the broker still holds for the run's queue, read once every worker has exited: ready
    messages (no consumer holds any now) and dead letters."""
    from oncebox.brokers.rabbitmq import RabbitQueue  # noqa: PLC0415

    wire = RabbitQueue(url, queue)
    try:
        return {"ready": wire.depth(), "dead": wire.depth("dead")}
    finally:
        wire.close()


def publish_again(url: str, queue: str, copies: list[tuple[str, str]]) -> None:
    """Publish (body, message id) pairs to the run's queue as the relay did: a duplicate publish
    made by hand, as a relay whose confirm was lost, or a producer retrying, would make one."""
    from oncebox.brokers.messages import Message  # noqa: PLC0415
    from oncebox.brokers.rabbitmq import RabbitQueue  # noqa: PLC0415

    wire = RabbitQueue(url, queue)
    try:
        wire.publish([Message(body.encode(), token) for body, token in copies])
    finally:
        wire.close()

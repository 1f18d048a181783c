"""A run's own broker queue, for the scenarios whose digests a broker holds.

RabbitMQ: the machine's broker (`ONCEBOX_CHAOS_AMQP`, else the local server's default) is shared,
so each run puts its digests on a queue of its own name and deletes it afterwards, and runs and
tests never read each other's messages; NATS likewise (`ONCEBOX_CHAOS_NATS`, else the local
server, its consumers' `ack_wait` 2 seconds). SQS: `ONCEBOX_CHAOS_SQS` (an `sqs://` URL), else an
SQS-compatible server of the run's own (moto's, when installed: the `dev` extra), on a free port,
with a 2-second visibility timeout so that a killed consumer's messages come back within the
run. After the run, what the broker still holds is read from outside: a message left visible or
dead-lettered is a job the checker could not see in the tables alone.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlencode, urlsplit

from oncebox.brokers.brokered import wire_for
from oncebox.brokers.messages import Message
from oncebox.kernel.errors import ConfigurationError

# pika logs a connection the broker closed as an error of its own; oncebox reports the outage
# itself (BrokerUnavailable, the lanes' backoff), and a chaos run causes it on purpose
logging.getLogger("pika").setLevel(logging.CRITICAL)

AMQP_ENV = "ONCEBOX_CHAOS_AMQP"
SQS_ENV = "ONCEBOX_CHAOS_SQS"
NATS_ENV = "ONCEBOX_CHAOS_NATS"
DEFAULT_NATS = "nats://127.0.0.1:4222"
DEFAULT_AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"


def _machine_broker(env: str, default: str, port: int, what: str) -> str:
    """The machine's broker named by `env` (else `default`), checked reachable: a scenario that
    needs one says so in one line rather than failing in a worker."""
    url = os.environ.get(env, default)
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    try:
        socket.create_connection((host, parts.port or port), timeout=5).close()
    except OSError as exc:
        raise ConfigurationError(
            f"this scenario needs {what} at {host}:{parts.port or port} ({exc}); start it, or "
            f"set {env}"
        ) from None
    return url


def broker_url() -> str:
    """The machine's RabbitMQ."""
    return _machine_broker(AMQP_ENV, DEFAULT_AMQP, 5672, "RabbitMQ")


def nats_url() -> str:
    """The machine's NATS server (JetStream on); its consumers' `ack_wait` is 2 seconds, so
    that a killed consumer's messages come back within the run."""
    url = _machine_broker(NATS_ENV, DEFAULT_NATS, 4222, "NATS")
    return url if urlsplit(url).query else f"{url}?ack_wait=2&wait=1"


@contextmanager
def run_broker(kind: str) -> Iterator[str]:
    """The broker a run of `kind` ("rabbitmq", "sqs" or "nats") uses, for the run."""
    if kind == "rabbitmq":
        yield broker_url()
        return
    if kind == "nats":
        yield nats_url()
        return
    if os.environ.get(SQS_ENV):
        yield os.environ[SQS_ENV]
        return
    from oncebox.fakes.sqs import sqs_server  # noqa: PLC0415 (moto: the dev extra)

    with sqs_server(credentials="chaos") as endpoint:
        query = urlencode({"endpoint": endpoint, "visibility": 2, "wait": 1})
        yield f"sqs://us-east-1?{query}"


@contextmanager
def run_queue(url: str) -> Iterator[str]:
    """A fresh queue name for the run's digests, its broker side declared, deleted afterwards."""
    name = f"chaos-{secrets.token_hex(5)}"
    wire = wire_for(url, name)
    try:
        wire.declare()
        yield name
    finally:
        try:
            wire.delete()
        finally:
            wire.close()


def left_in_broker(url: str, queue: str) -> dict[str, int]:
    """What the broker still holds for the run's queue, read once every worker has exited:
    visible messages (no consumer holds any now), messages in flight, messages it gave up on
    that no sweep made dead letters (`lanes/given_up.py`), and dead letters."""
    wire = wire_for(url, queue)
    try:
        in_flight = getattr(wire, "in_flight", None)  # SQS: held until a timeout runs out
        swept = hasattr(wire, "given_up")
        return {
            "ready": wire.depth(),
            "dead": wire.depth("dead"),
            "in_flight": in_flight() if in_flight is not None else 0,
            "given_up": wire.depth("given_up") if swept else 0,
        }
    finally:
        wire.close()


def publish_again(url: str, queue: str, copies: list[tuple[str, str]]) -> None:
    """Publish (body, message id) pairs to the run's queue as the relay did: a duplicate publish
    made by hand, as a relay whose confirm was lost, or a producer retrying, would make one."""
    wire = wire_for(url, queue)
    try:
        wire.publish([Message(body.encode(), token) for body, token in copies])
    finally:
        wire.close()

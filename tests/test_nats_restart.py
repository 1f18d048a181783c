"""A NATS server restarting under the wire, on a private server (the machine's is shared and never
restarted): the connection it held is lost as one `BrokerUnavailable` and the next call opens a
new one; JetStream's file-stored stream keeps every message, and its durable consumer delivers
again what was fetched and not acknowledged before the restart."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from oncebox.brokers.messages import Message, Received
from oncebox.brokers.nats import wire as nats_wire
from oncebox.brokers.nats.wire import NatsQueue
from oncebox.chaos.private_nats import PrivateNats, private_nats
from oncebox.kernel import clock
from oncebox.kernel.errors import BrokerUnavailable
from support.brokers import nats_server_installed
from support.waiting import wait_until

ACK_WAIT_S = 2  # the unacknowledged message comes back this long after its delivery
IDS = [f"m-{n}" for n in range(5)]


@pytest.fixture
def server() -> Iterator[PrivateNats]:
    nats_server_installed()
    with private_nats() as own:  # its folder goes with it: no stream to delete
        yield own


@pytest.fixture
def wire(server: PrivateNats) -> Iterator[NatsQueue]:
    queue = NatsQueue(f"{server.server}?ack_wait={ACK_WAIT_S}", "restarted", wait_s=1.0)
    queue.declare()
    try:
        yield queue
    finally:
        queue.close()


def published(wire: NatsQueue) -> None:
    wire.publish(
        [Message(f"body of {mid}".encode(), mid, {"x-oncebox-channel": "c"}) for mid in IDS]
    )


def test_a_restart_keeps_every_message_and_delivers_the_unacknowledged_one_again(
    server: PrivateNats, wire: NatsQueue
) -> None:
    published(wire)
    [held] = wire.receive(1)  # fetched, never acknowledged: the restart takes its connection
    assert (wire.depth(), wire.in_flight()) == (4, 1)

    server.restart()

    with pytest.raises(BrokerUnavailable) as lost:
        wire.ack([held])
    assert str(lost.value).startswith(f"NATS at {server.server}: ")
    assert lost.value.__cause__ is None and lost.value.__suppress_context__  # one error, no stack
    # a fresh call opens a new connection; the stream and its consumer were restored from disk
    assert (wire.depth(), wire.in_flight()) == (4, 1), "the restart lost messages"

    seen: dict[str, Received] = {}

    def every_message_came() -> bool:
        got = wire.receive(5)
        seen.update((one.message.message_id, one) for one in got)
        if got:
            wire.ack(got)
        return len(seen) == len(IDS)

    wait_until(every_message_came, timeout=60, what=f"{IDS} again after the restart")
    assert sorted(seen) == IDS
    again = seen[held.message.message_id]
    assert again.redelivered and again.message.headers["x-oncebox-attempt"] == "2"
    assert again.message.body == held.message.body
    assert [mid for mid, one in seen.items() if one.redelivered] == [held.message.message_id]
    assert (wire.depth(), wire.in_flight()) == (0, 0)


def test_a_call_while_the_server_is_down_is_refused_at_once_and_quietly(
    server: PrivateNats,
    wire: NatsQueue,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(nats_wire, "CALL_TIMEOUT_S", 30.0)  # a hang, bounded
    published(wire)
    server.stop()
    caplog.set_level(logging.WARNING)
    started = clock.monotonic()
    with pytest.raises(BrokerUnavailable):
        wire.depth()
    took = clock.monotonic() - started
    assert took < 15, f"a call while the server was down took {took:.1f} s to be refused"
    noise = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert noise == [], "the wire reports an outage itself (BrokerUnavailable), nothing else"
    server.start()
    assert wire.depth() == len(IDS)

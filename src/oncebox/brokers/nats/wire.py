"""An oncebox queue's NATS JetStream side: a stream, a durable pull consumer, acks as settlement.

`nats://HOST:4222` (with `?ack_wait=SECONDS`, the lease: 30 by default, `wait=SECONDS`, the
pull's wait: 1, `max_deliveries=N`: 50, and `duplicates=SECONDS`, the duplicate window: 120,
JetStream's default). For an oncebox queue Q:

- the stream `ONCEBOX_Q` on the subject `oncebox.Q`, a work queue (a message is removed when
  acknowledged), its duplicate window dropping a second publish with the same `Nats-Msg-Id` —
  the message's oncebox id — whether or not the first is still there;
- its durable pull consumer `oncebox`, explicit acks: a message fetched and neither acknowledged
  nor marked in progress within `ack_wait` is delivered again (the lease; `extend` is the
  heartbeat, an in-progress ack), and at most `max_deliveries` times (`MaxDeliver`): a message
  never settled in that many deliveries — a handler that kills its worker, workers that keep
  dying — is no longer delivered, and JetStream says so in an advisory;
- the stream `ONCEBOX_Q_GIVEN_UP`, capturing those advisories
  (`$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ONCEBOX_Q.oncebox`), so that none is lost while no
  worker listens: the workers' sweep (`lanes/given_up.py`) reads each, fetches the message it
  names by its stream sequence, makes it an oncebox dead letter (a relayed job's row turns `dead`,
  an unrecorded message moves to the dead letters with the reason) and deletes it from the queue;
- the stream `ONCEBOX_Q_DEAD` on `oncebox.Q.dead`: dead letters, each with its headers.

Names keep the letters, digits, `_` and `-` of Q; any other character becomes `_`. JetStream's
client is asyncio: each `NatsQueue` runs its connection on an event loop of its own, in a thread,
and its methods wait for the loop's answer — so a lane calls it like the other wires. An
unrecorded message's attempt is JetStream's delivery count, so an unrecorded task must make no
more attempts than `max_deliveries` (said when it is published); its retry is a negative
acknowledgement with a delay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import nats
import nats.errors
import nats.js.errors
from nats.js import api

from oncebox.brokers.messages import GivenUp, Message, Received
from oncebox.kernel.errors import BrokerRefused, BrokerUnavailable, ConfigurationError

ATTEMPT = "x-oncebox-attempt"
_ID = "Nats-Msg-Id"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
CALL_TIMEOUT_S = 60.0
MAX_DELIVERIES = 50
DUPLICATES_S = 120.0  # JetStream's default duplicate window
ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES"
T = TypeVar("T")


async def _reported_by_the_wire(exc: Exception) -> None:
    """nats-py's error callback: its default logs each lost connection with a traceback; the
    wire reports it once, as `BrokerUnavailable`, to a caller that backs off."""


class NatsQueue:
    """One oncebox queue on JetStream, for one lane or relay (a connection of its own)."""

    # an unrecorded message's attempt is JetStream's delivery count: a copy would start it again
    attempt_is_delivery_count = True

    def __init__(self, url: str, queue: str, *, prefetch: int = 100, wait_s: float = 1.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("nats", "tls") or not parts.netloc:
            raise ConfigurationError("a NATS broker is nats://HOST:4222[?ack_wait=SECONDS]")
        options = dict(parse_qsl(parts.query))
        self.url = url
        self.server = urlunsplit(parts._replace(query=""))
        self.ack_wait_s = float(options.get("ack_wait", "30"))
        self.wait_s = float(options.get("wait", str(wait_s)))
        self.max_deliveries = int(options.get("max_deliveries", str(MAX_DELIVERIES)))
        self.duplicates_s = float(options.get("duplicates", str(DUPLICATES_S)))
        if self.max_deliveries < 1:
            raise ConfigurationError("a NATS broker's max_deliveries is at least 1")
        self.prefetch = prefetch
        safe = _UNSAFE.sub("_", queue)[:100]
        self.name = f"ONCEBOX_{safe}"
        self.dead_name = f"{self.name}_DEAD"
        self.subject = f"oncebox.{safe}"
        self.dead_subject = f"{self.subject}.dead"
        self.given_up_name = f"{self.name}_GIVEN_UP"
        self.given_up_subject = f"{ADVISORY}.{self.name}.oncebox"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._nc: Any = None
        self._js: Any = None
        self._sub: Any = None
        self._advisories: Any = None
        self._fetched: dict[str, Any] = {}  # reply subject -> the message, until settled

    # -- the loop ------------------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        """Run `coro` on this queue's loop and wait for it; NATS's errors as oncebox's."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="oncebox-nats", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(CALL_TIMEOUT_S)
        except nats.js.errors.APIError as exc:
            raise BrokerRefused(f"NATS refused to {what} {self.name!r}: {exc}") from None
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            future.cancel()
            self.close()
            raise BrokerUnavailable(f"NATS at {self.server}: {exc!r}") from None

    async def _connected(self) -> Any:
        if self._nc is None or not self._nc.is_connected:
            # no reconnect loop: a server that is away is BrokerUnavailable within two connect
            # attempts (with max_reconnect_attempts=0 nats-py keeps retrying the first connect
            # until the call times out), and the lanes' backoff decides when to look again
            self._nc = await nats.connect(
                self.server,
                connect_timeout=5,
                max_reconnect_attempts=1,
                reconnect_time_wait=0,
                allow_reconnect=False,
                error_cb=_reported_by_the_wire,
            )
            self._js = self._nc.jetstream()
            self._sub = self._advisories = None
            self._fetched.clear()  # an earlier connection's messages: JetStream's again
        return self._js

    def close(self) -> None:
        loop, thread, nc = self._loop, self._thread, self._nc
        self._loop, self._thread, self._nc, self._js = None, None, None, None
        self._sub = self._advisories = None
        self._fetched.clear()
        if loop is None:
            return
        if nc is not None:
            closing = asyncio.run_coroutine_threadsafe(nc.close(), loop)
            with contextlib.suppress(Exception):  # going away: nothing to tell
                closing.result(10)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(10)
        loop.close()

    # -- topology ------------------------------------------------------------------------------

    def declare(self) -> None:
        """Add the streams and the durable consumer (idempotent)."""

        async def declare() -> None:
            js = await self._connected()
            for name, subject in (
                (self.name, self.subject),
                (self.dead_name, self.dead_subject),
                (self.given_up_name, self.given_up_subject),
            ):
                config = api.StreamConfig(
                    name=name,
                    subjects=[subject],
                    retention=api.RetentionPolicy.WORK_QUEUE,
                    storage=api.StorageType.FILE,
                    duplicate_window=self.duplicates_s,
                )
                try:
                    await js.add_stream(config)
                except nats.js.errors.BadRequestError:
                    await js.update_stream(config)
            for stream, subject, most in (
                (self.name, self.subject, self.max_deliveries),
                (self.given_up_name, self.given_up_subject, -1),
            ):
                await js.add_consumer(
                    stream,
                    api.ConsumerConfig(
                        durable_name="oncebox",
                        ack_policy=api.AckPolicy.EXPLICIT,
                        ack_wait=self.ack_wait_s,
                        max_ack_pending=-1,
                        max_deliver=most,
                        filter_subject=subject,
                    ),
                )

        self._call(declare(), "declare")

    def delete(self) -> None:
        async def delete() -> None:
            js = await self._connected()
            for name in (self.name, self.dead_name, self.given_up_name):
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await js.delete_stream(name)

        self._call(delete(), "delete")

    def depth(self, which: str = "") -> int:
        """Messages waiting (`which`: "" — not yet delivered —, "dead", or "given_up": given up
        on and not yet swept)."""

        async def depth() -> int:
            js = await self._connected()
            if which in ("dead", "given_up"):
                name = self.dead_name if which == "dead" else self.given_up_name
                return int((await js.stream_info(name)).state.messages)
            consumer = await js.consumer_info(self.name, "oncebox")
            return int(consumer.num_pending or 0)

        return self._call(depth(), "read")

    def in_flight(self) -> int:
        """Messages delivered and not yet acknowledged: delivered again when `ack_wait` runs
        out."""

        async def pending() -> int:
            js = await self._connected()
            return int((await js.consumer_info(self.name, "oncebox")).num_ack_pending or 0)

        return self._call(pending(), "read")

    # -- publish -------------------------------------------------------------------------------

    async def _publish_all(self, messages: Sequence[Message], subject: str) -> list[bool]:
        js = await self._connected()

        async def one(message: Message) -> bool:
            headers = {str(k): str(v) for k, v in message.headers.items()}
            headers[_ID] = message.message_id
            await js.publish(subject, message.body, headers=headers, timeout=10)
            return True

        return list(await asyncio.gather(*(one(m) for m in messages)))

    def publish_batch(self, messages: Sequence[Message], *, to: str | None = None) -> set[str]:
        """Publish all at once, each acknowledged by the stream (a second copy within the
        duplicate window is acknowledged as a duplicate: taken, and dropped). Nothing is
        returned unrouted (a subject no stream holds raises `BrokerRefused`); a connection lost
        while publishing raises `BrokerUnavailable(maybe_published=True)`."""
        subject = to or self.subject
        try:
            self._call(self._publish_all(messages, subject), "publish to")
        except BrokerUnavailable as exc:
            raise BrokerUnavailable(str(exc), maybe_published=True) from None
        except BrokerRefused:
            raise
        return set()

    def publish(self, messages: Sequence[Message], *, to: str | None = None) -> None:
        self.publish_batch(messages, to=to)

    # -- consume -------------------------------------------------------------------------------

    def receive(self, limit: int) -> list[Received]:
        """Up to `limit` messages, waiting up to `wait_s` for the first."""

        async def fetch() -> list[Received]:
            js = await self._connected()
            if self._sub is None:
                self._sub = await js.pull_subscribe(
                    self.subject, durable="oncebox", stream=self.name
                )
            try:
                msgs = await self._sub.fetch(batch=max(1, limit), timeout=self.wait_s)
            except (TimeoutError, nats.errors.TimeoutError):
                return []
            found = []
            for msg in msgs:
                self._fetched[msg.reply] = msg
                headers = dict(msg.headers or {})
                delivered = int(msg.metadata.num_delivered)
                message_id = headers.pop(_ID, None) or str(msg.metadata.sequence.stream)
                headers.setdefault(ATTEMPT, str(delivered))  # an unrecorded message's
                found.append(
                    Received(Message(msg.data, message_id, headers), msg.reply, delivered > 1)
                )
            return found

        return self._call(fetch(), "receive from")

    def _settle(self, received: Sequence[Received], how: str, **options: Any) -> None:
        """`how` (ack, nak, in_progress) on each message, on the connection it came on: one
        that came on an earlier connection cannot be settled here — JetStream delivers it
        again when its `ack_wait` runs out (`BrokerUnavailable`, the connection kept)."""
        msgs = [self._fetched.get(str(one.tag)) for one in received]
        if any(msg is None for msg in msgs):
            raise BrokerUnavailable(
                f"NATS at {self.server}: the connection these came on is closed; JetStream "
                "delivers them again"
            )
        if how != "in_progress":  # settled for good: no longer this connection's to hold
            for one in received:
                self._fetched.pop(str(one.tag), None)

        async def settle() -> None:
            await asyncio.gather(*(getattr(msg, how)(**options) for msg in msgs))
            if self._nc is not None:
                await self._nc.flush(timeout=10)

        self._call(settle(), "settle on")

    def ack(self, received: Sequence[Received]) -> None:
        """Acknowledged: removed from the work queue."""
        self._settle(received, "ack")

    def give_back(self, received: Sequence[Received]) -> None:
        """Delivered again at once (a negative acknowledgement): that delivery counts."""
        self._settle(received, "nak")

    def hand_back(self, received: Sequence[Received]) -> None:
        """Back to the queue unrun, no delivery spent: a copy each under a `Nats-Msg-Id` of its
        own (the stream would drop the same id within its duplicate window), then the originals
        acknowledged. Only for a message whose attempt is not its delivery count (a relayed
        job's publish, which carries its attempt in its body); a consumer that dies in between
        leaves both, and the job's row absorbs the second."""
        if not received:
            return
        copies = []
        for one in received:
            message = one.message
            headers = {k: v for k, v in message.headers.items() if k != ATTEMPT}
            base = message.message_id.partition("~")[0]
            copies.append(Message(message.body, f"{base}~{uuid.uuid4().hex[:12]}", headers))
        self.publish(copies)
        self.ack(received)

    def extend(self, received: Sequence[Received], seconds: float) -> None:
        """Still working: `ack_wait` starts again (JetStream's in-progress acknowledgement)."""
        self._settle(received, "in_progress")

    def retry(self, received: Received, delay_ms: float, headers: Mapping[str, Any]) -> int:
        """Delivered again after `delay_ms` (a negative acknowledgement with a delay): its
        delivery count, which is its attempt, one higher."""
        self._settle([received], "nak", delay=max(0.0, delay_ms / 1000))
        return int(delay_ms)

    def dead(self, received: Received, headers: Mapping[str, Any]) -> None:
        """Publish to the dead letters with `headers` merged in, then acknowledge."""
        message = received.message
        dead = Message(message.body, message.message_id, {**message.headers, **headers})
        self.publish([dead], to=self.dead_subject)
        self.ack([received])

    # -- what JetStream gave up on -------------------------------------------------------------

    def given_up(self, limit: int) -> list[GivenUp]:
        """Up to `limit` messages JetStream stopped delivering (`MaxDeliver`), from their
        advisories; an advisory whose message is gone already (settled late) is acknowledged
        here and not returned."""

        async def read() -> list[GivenUp]:
            js = await self._connected()
            if self._advisories is None:
                self._advisories = await js.pull_subscribe(
                    self.given_up_subject, durable="oncebox", stream=self.given_up_name
                )
            try:
                advisories = await self._advisories.fetch(batch=max(1, limit), timeout=0.5)
            except (TimeoutError, nats.errors.TimeoutError):
                return []
            found = []
            for advisory in advisories:
                try:
                    said = json.loads(advisory.data)
                    sequence, deliveries = int(said["stream_seq"]), int(said["deliveries"])
                except (ValueError, TypeError, KeyError):  # not an advisory: nothing to sweep
                    await advisory.ack()
                    continue
                try:
                    raw = await js.get_msg(self.name, sequence)
                except nats.js.errors.NotFoundError:
                    await advisory.ack()
                    continue
                headers = dict(raw.headers or {})
                message_id = headers.pop(_ID, None) or str(sequence)
                message = Message(raw.data or b"", message_id, headers)
                found.append(GivenUp(message, deliveries, (advisory, sequence)))
            return found

        return self._call(read(), "read the advisories of")

    def bury(self, given: GivenUp, headers: Mapping[str, Any] | None) -> None:
        """Done with a message JetStream gave up on: with `headers`, published to the dead
        letters with them merged in (an unrecorded message); then deleted from the queue's
        stream and its advisory acknowledged."""
        if headers is not None:
            message = given.message
            dead = Message(message.body, message.message_id, {**message.headers, **headers})
            self.publish([dead], to=self.dead_subject)
        advisory, sequence = given.handle

        async def bury() -> None:
            js = await self._connected()
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_msg(self.name, sequence)
            await advisory.ack()
            if self._nc is not None:
                await self._nc.flush(timeout=10)

        self._call(bury(), "delete from")

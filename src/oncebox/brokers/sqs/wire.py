"""An oncebox queue's Amazon SQS side: its queues, batched sends, visibility as the lease.

`sqs://REGION` (credentials as boto3 finds them: the environment, a profile, a role), with
`?endpoint=URL` for an SQS-compatible server (the tests start `moto`'s), `fifo=true` for FIFO
queues, `visibility=SECONDS` (the lease: 30 by default), `wait=SECONDS` (the long poll: 1) and
`max_deliveries=N` (50). For an oncebox queue Q:

- `oncebox-Q` (`oncebox-Q.fifo`): the queue, its visibility timeout the consumers' lease — a
  message received and neither deleted nor extended in time is received again;
- `oncebox-Q-redriven`: its redrive target. SQS moves a message there once it has been received
  `max_deliveries` times without being deleted — a handler that kills its worker, workers that
  keep dying or overrunning their lease (every receive counts: a claim that waited too long, a
  batch received while the store was away; an unrecorded message given back on shutdown — a
  relayed job's is handed back as a copy, see `hand_back`). Nothing consumes it but the
  workers' sweep (`lanes/given_up.py`), which makes each an oncebox dead letter: a
  relayed job's row turns `dead` (its key kept: SQS mints new message ids, the job's id travels in
  the body), an unrecorded message moves to `oncebox-Q-dead` with the reason;
- `oncebox-Q-dead`: an unrecorded message's dead letters, with their errors.

Names keep the letters, digits, `_` and `-` of Q; any other character becomes `-`. A message
carries oncebox's id and headers as message attributes (SQS mints message ids of its own). An
unrecorded message's attempt is SQS's receive count, and its retry makes it invisible for its
delay (at most 12 hours) rather than sending a copy, which FIFO queues could not delay. A FIFO
message's group is a SHA-256 of its `x-oncebox-group` header — a relayed job's `group_by` value,
which SQS's 128 characters of ASCII punctuation and letters might not hold — else its id, and
its deduplication id a SHA-256 of its oncebox id: SQS drops a second copy sent within five
minutes. An unrecorded task must
make no more attempts than `max_deliveries` (its attempt is SQS's receive count): said when it
is published.

SQS takes at most 1 MiB per message, body and attributes together (256 KiB until August 2025;
the queues are declared with the 1 MiB maximum), and 1 MiB per batch call: `check_size` says a
message is too large before anything is sent, and batches are cut by size as well as by count.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import boto3
import botocore.exceptions
from botocore.config import Config

from oncebox.brokers.messages import SQS_MAX_MESSAGE_BYTES, GivenUp, Message, Received
from oncebox.kernel.errors import BrokerRefused, BrokerUnavailable, ConfigurationError

MAX_MESSAGE_BYTES = SQS_MAX_MESSAGE_BYTES  # per message (body and attributes), and per batch
BATCH = 10  # SQS's most per batch call
MAX_DELIVERIES = 50  # the redrive policy's maxReceiveCount unless the URL says otherwise
MAX_INVISIBLE_S = 43_200  # 12 hours: SQS's longest visibility timeout
ATTEMPT = "x-oncebox-attempt"
GROUP = "x-oncebox-group"
ERROR = "x-oncebox-error"
_ID = "oncebox-id"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def message_size(body: bytes, headers: Mapping[str, Any] | None = None) -> int:
    """What SQS counts of a message: its body and its attributes' names, types and values."""
    return len(body) + sum(len(k) + len(str(v)) + 8 for k, v in (headers or {}).items()) + 64


def check_size(body: bytes, headers: Mapping[str, Any] | None = None) -> None:
    """Raise `BrokerRefused` for a message SQS would refuse for its size, before sending it."""
    size = message_size(body, headers)
    if size > MAX_MESSAGE_BYTES:
        raise BrokerRefused(
            f"a message of {size} bytes (body and attributes) exceeds SQS's {MAX_MESSAGE_BYTES}"
        )


def dead_copy(message: Message, headers: Mapping[str, Any]) -> Message:
    """`message` with `headers` merged in, its error cut short enough that SQS takes it: a
    message near the cap would otherwise never reach the dead letters."""
    merged = {**message.headers, **headers}
    error = str(merged.get(ERROR, ""))
    room = MAX_MESSAGE_BYTES - message_size(message.body, {**merged, ERROR: "", _ID: "x" * 64})
    if ERROR in merged and len(error.encode()) > room:
        merged[ERROR] = error.encode()[: max(0, room - 3)].decode(errors="ignore") + "…"
    return Message(message.body, message.message_id, merged)


def _copy(message: Message) -> Message:
    """A received message to send again as a new one: an id of its own (`<id>~<nonce>`), and
    without the attempt its receive count gave it."""
    headers = {k: v for k, v in message.headers.items() if k != ATTEMPT}
    base = message.message_id.partition("~")[0]
    return Message(message.body, f"{base}~{uuid.uuid4().hex[:12]}", headers)


def _batches(messages: Sequence[Message]) -> Iterator[Sequence[Message]]:
    """Consecutive runs of at most `BATCH` messages and `MAX_MESSAGE_BYTES` together: SQS
    refuses a longer batch call whole."""
    start, size = 0, 0
    for end, message in enumerate(messages):
        grows = message_size(message.body, {**message.headers, _ID: message.message_id})
        if end > start and (end - start == BATCH or size + grows > MAX_MESSAGE_BYTES):
            yield messages[start:end]
            start, size = end, 0
        size += grows
    if start < len(messages):
        yield messages[start:]


class SqsQueue:
    """One oncebox queue on SQS, for one lane or relay (its own boto3 client)."""

    # an unrecorded message's attempt is SQS's receive count: a copy would start it again
    attempt_is_delivery_count = True

    def __init__(self, url: str, queue: str, *, prefetch: int = 100, wait_s: float = 1.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "sqs" or not parts.netloc:
            raise ConfigurationError("an SQS broker is sqs://REGION[?endpoint=URL&fifo=true]")
        options = dict(parse_qsl(parts.query))
        self.url = url
        self.region = parts.netloc
        self.endpoint = options.get("endpoint")
        self.fifo = options.get("fifo", "false").lower() in ("1", "true", "yes")
        self.visibility_s = int(options.get("visibility", "30"))
        self.wait_s = min(20, int(options.get("wait", str(math.ceil(wait_s)))))
        self.max_deliveries = int(options.get("max_deliveries", str(MAX_DELIVERIES)))
        if not 1 <= self.max_deliveries <= 1000:
            raise ConfigurationError("an SQS broker's max_deliveries is 1 to 1000 (SQS's range)")
        self.prefetch = prefetch
        safe = _UNSAFE.sub("-", queue)[:56]  # SQS names: 80 characters at most
        suffix = ".fifo" if self.fifo else ""
        self.name = f"oncebox-{safe}{suffix}"
        self.dead_name = f"oncebox-{safe}-dead{suffix}"
        self.given_up_name = f"oncebox-{safe}-redriven{suffix}"
        self._client: Any = None
        self._urls: dict[str, str] = {}

    # -- connection ----------------------------------------------------------------------------

    def _sqs(self) -> Any:
        if self._client is None:
            self._client = boto3.client(
                "sqs",
                region_name=self.region,
                endpoint_url=self.endpoint,
                config=Config(retries={"max_attempts": 2, "mode": "standard"}, read_timeout=30),
            )
        return self._client

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    @contextmanager
    def _wire(self, what: str) -> Iterator[None]:
        """SQS's errors as oncebox's: a refusal (a client error) or the service away."""
        try:
            yield
        except botocore.exceptions.ClientError as exc:
            raise BrokerRefused(f"SQS refused to {what} {self.name!r}: {exc}") from None
        except (botocore.exceptions.BotoCoreError, OSError) as exc:
            self.close()
            raise BrokerUnavailable(f"SQS at {self._shown()}: {exc!r}") from None

    def _shown(self) -> str:
        return self.endpoint or self.region

    def _url(self, name: str) -> str:
        if name not in self._urls:
            with self._wire("find"):
                self._urls[name] = self._sqs().get_queue_url(QueueName=name)["QueueUrl"]
        return self._urls[name]

    # -- topology ------------------------------------------------------------------------------

    def declare(self) -> None:
        """Create the queues (idempotent); the main queue's lease and redrive set each time, so
        a changed `visibility` or `max_deliveries` takes effect."""
        fifo = {"FifoQueue": "true"} if self.fifo else {}
        with self._wire("declare"):
            sqs = self._sqs()
            urls = {
                name: sqs.create_queue(QueueName=name, Attributes=fifo)["QueueUrl"]
                for name in (self.dead_name, self.given_up_name, self.name)
            }
            for url in urls.values():  # a queue made before August 2025 took 256 KiB
                sqs.set_queue_attributes(
                    QueueUrl=url, Attributes={"MaximumMessageSize": str(MAX_MESSAGE_BYTES)}
                )
            target = sqs.get_queue_attributes(
                QueueUrl=urls[self.given_up_name], AttributeNames=["QueueArn"]
            )["Attributes"]["QueueArn"]
            redrive = {"deadLetterTargetArn": target, "maxReceiveCount": self.max_deliveries}
            sqs.set_queue_attributes(
                QueueUrl=urls[self.name],
                Attributes={
                    "VisibilityTimeout": str(self.visibility_s),
                    "RedrivePolicy": json.dumps(redrive),
                },
            )
        self._urls.update(urls)

    def delete(self) -> None:
        """Remove the queues (tests, and an app retiring a queue)."""
        with self._wire("delete"):
            for name in (self.name, self.given_up_name, self.dead_name):
                self._sqs().delete_queue(QueueUrl=self._url(name))
        self._urls.clear()

    def depth(self, which: str = "") -> int:
        """Messages visible in the queue (`which`: "", "dead" or "given_up": redriven, not yet
        swept), not counting those in flight."""
        name = {"dead": self.dead_name, "given_up": self.given_up_name}.get(which, self.name)
        with self._wire("read"):
            found = self._sqs().get_queue_attributes(
                QueueUrl=self._url(name), AttributeNames=["ApproximateNumberOfMessages"]
            )
        return int(found["Attributes"]["ApproximateNumberOfMessages"])

    def in_flight(self) -> int:
        """Messages received and not yet deleted: invisible until their timeout runs out."""
        with self._wire("read"):
            found = self._sqs().get_queue_attributes(
                QueueUrl=self._url(self.name),
                AttributeNames=["ApproximateNumberOfMessagesNotVisible"],
            )
        return int(found["Attributes"]["ApproximateNumberOfMessagesNotVisible"])

    # -- publish -------------------------------------------------------------------------------

    def _entry(self, index: int, message: Message) -> dict[str, Any]:
        check_size(message.body, message.headers)
        attributes = {
            key: {"DataType": "String", "StringValue": str(value)}
            for key, value in {**message.headers, _ID: message.message_id}.items()
        }
        entry: dict[str, Any] = {
            "Id": str(index),
            "MessageBody": message.body.decode(),
            "MessageAttributes": attributes,
        }
        if self.fifo:
            group = message.headers.get(GROUP)
            entry["MessageGroupId"] = (
                message.message_id
                if group is None
                else hashlib.sha256(str(group).encode()).hexdigest()
            )
            entry["MessageDeduplicationId"] = hashlib.sha256(
                message.message_id.encode()
            ).hexdigest()
        return entry

    def publish_batch(self, messages: Sequence[Message], *, to: str | None = None) -> set[str]:
        """Send in batches of ten; the oncebox ids SQS did not take (each batch answers per
        message). A connection lost while sending raises `BrokerUnavailable(maybe_published=
        True)`: SQS may have taken some."""
        failed: set[str] = set()
        url = self._url(to or self.name)
        for chunk in _batches(messages):
            entries = [self._entry(i, m) for i, m in enumerate(chunk)]
            try:
                answer = self._sqs().send_message_batch(QueueUrl=url, Entries=entries)
            except botocore.exceptions.ClientError as exc:
                raise BrokerRefused(f"SQS refused a batch for {self.name!r}: {exc}") from None
            except (botocore.exceptions.BotoCoreError, OSError) as exc:
                self.close()
                raise BrokerUnavailable(
                    f"SQS at {self._shown()}: {exc!r}", maybe_published=True
                ) from None
            failed.update(chunk[int(f["Id"])].message_id for f in answer.get("Failed", []))
        return failed

    def publish(self, messages: Sequence[Message], *, to: str | None = None) -> None:
        """Send, each taken or `BrokerRefused`."""
        failed = self.publish_batch(messages, to=to)
        if failed:
            raise BrokerRefused(f"SQS did not take {len(failed)} message(s) for {self.name!r}")

    # -- consume -------------------------------------------------------------------------------

    def receive(self, limit: int) -> list[Received]:
        """Up to `limit` messages: the first call waits up to `wait_s` (a long poll), the next
        take only what is there."""
        found: list[Received] = []
        url = self._url(self.name)
        wait = self.wait_s
        while len(found) < limit:
            with self._wire("receive from"):
                answer = self._sqs().receive_message(
                    QueueUrl=url,
                    MaxNumberOfMessages=min(BATCH, limit - len(found)),
                    WaitTimeSeconds=wait,
                    MessageAttributeNames=["All"],
                    AttributeNames=["ApproximateReceiveCount"],
                )
            got = answer.get("Messages", [])
            found += [self._received(m) for m in got]
            if len(got) < BATCH:
                break
            wait = 0
        return found

    @staticmethod
    def _received(raw: Mapping[str, Any]) -> Received:
        attributes = {
            key: value.get("StringValue") for key, value in raw.get("MessageAttributes", {}).items()
        }
        receives = int(raw.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
        message_id = attributes.pop(_ID, None) or raw["MessageId"]
        attributes.setdefault(ATTEMPT, str(receives))  # an unrecorded message's: SQS's count
        return Received(
            Message(raw["Body"].encode(), message_id, attributes),
            raw["ReceiptHandle"],
            receives > 1,
        )

    def _batched(
        self, call: str, received: Sequence[Received], *, name: str = "", **fields: Any
    ) -> None:
        url = self._url(name or self.name)
        for start in range(0, len(received), BATCH):
            chunk = received[start : start + BATCH]
            entries = [
                {"Id": str(i), "ReceiptHandle": str(one.tag), **fields}
                for i, one in enumerate(chunk)
            ]
            with self._wire("settle on"):
                answer = getattr(self._sqs(), call)(QueueUrl=url, Entries=entries)
            if answer.get("Failed"):
                # a receipt that ran out (the message was received again): SQS delivers it
                raise BrokerUnavailable(
                    f"SQS at {self._shown()}: {len(answer['Failed'])} receipt(s) no longer "
                    "valid; the messages are delivered again"
                )

    def ack(self, received: Sequence[Received]) -> None:
        """Delete what was handled (a receipt that ran out: SQS delivers it again)."""
        self._batched("delete_message_batch", received)

    def give_back(self, received: Sequence[Received]) -> None:
        """Visible again at once, for another consumer: its next receive counts."""
        self._batched("change_message_visibility_batch", received, VisibilityTimeout=0)

    def hand_back(self, received: Sequence[Received]) -> None:
        """Back to the queue unrun, no receive spent: a copy each under an id of its own (FIFO
        would drop the same id within five minutes), then the originals deleted. Only for a
        message whose attempt is not its receive count (a relayed job's publish, which carries
        its attempt in its body); a consumer that dies in between leaves both, and the job's row
        absorbs the second."""
        if not received:
            return
        self.publish([_copy(one.message) for one in received])
        self.ack(received)

    def extend(self, received: Sequence[Received], seconds: float) -> None:
        """Keep holding: invisible for `seconds` more (the lease's heartbeat)."""
        invisible = max(1, min(MAX_INVISIBLE_S, math.ceil(seconds)))
        self._batched("change_message_visibility_batch", received, VisibilityTimeout=invisible)

    def retry(self, received: Received, delay_ms: float, headers: Mapping[str, Any]) -> int:
        """Invisible for at least `delay_ms` (at most 12 hours), then received again — its
        receive count, which is its attempt, one higher; the delay it will wait, in ms."""
        delay_s = max(0, min(MAX_INVISIBLE_S, math.ceil(delay_ms / 1000)))
        self._batched("change_message_visibility_batch", [received], VisibilityTimeout=delay_s)
        return delay_s * 1000

    def dead(self, received: Received, headers: Mapping[str, Any]) -> None:
        """Send the message to the dead letters with `headers` merged in, then delete it."""
        self.publish([dead_copy(received.message, headers)], to=self.dead_name)
        self.ack([received])

    # -- what SQS gave up on ---------------------------------------------------------------------

    def given_up(self, limit: int) -> list[GivenUp]:
        """Up to `limit` messages SQS redrove after `max_deliveries` receives, held from other
        sweeps for `visibility`. The first receive waits up to a second (a long poll asks every
        SQS server; a short one may answer empty while messages wait)."""
        found: list[Received] = []
        wait = 1
        while len(found) < limit:
            with self._wire("receive from"):
                answer = self._sqs().receive_message(
                    QueueUrl=self._url(self.given_up_name),
                    MaxNumberOfMessages=min(BATCH, limit - len(found)),
                    WaitTimeSeconds=wait,
                    VisibilityTimeout=self.visibility_s,
                    MessageAttributeNames=["All"],
                )
            got = answer.get("Messages", [])
            found += [self._received(raw) for raw in got]
            if len(got) < BATCH:
                break
            wait = 0
        return [GivenUp(one.message, self.max_deliveries, one) for one in found]

    def bury(self, given: GivenUp, headers: Mapping[str, Any] | None) -> None:
        """Done with a message SQS gave up on: with `headers`, moved to the dead letters with
        them merged in (an unrecorded message); without, deleted (a relayed job, whose row the
        sweep made dead first)."""
        if headers is not None:
            self.publish([dead_copy(given.message, headers)], to=self.dead_name)
        self._batched("delete_message_batch", [given.handle], name=self.given_up_name)

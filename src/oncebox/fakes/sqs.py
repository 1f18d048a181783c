"""An SQS-compatible server of our own: moto's, in a thread of this process, on a free port.

SQS is truly outside (an AWS service), so the tests, the chaos harness and the dedupe benchmark
talk to moto's server instead — over HTTP, through boto3, as an application would. Where moto
differs from what AWS documents in a way our figures depend on, it is made to behave like AWS:

- **FIFO deduplication.** AWS drops a message whose deduplication id was sent successfully in the
  last five minutes, whether or not that first message is still in the queue. moto only compares
  against messages still in the queue, so a copy sent after the first was received and deleted
  would be delivered — understating what FIFO removes. The queue here remembers each id's first
  send for `DEDUP_WINDOW_S`, as AWS does.

moto comes with oncebox's `dev` extra; boto3 gets test credentials unless the environment has
some.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from oncebox.kernel.errors import ConfigurationError

DEDUP_WINDOW_S = 300  # AWS: "the 5-minute deduplication interval"
_patched = threading.Lock()
_done: list[bool] = []


def _remembering(add_message: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """moto's `Queue.add_message`, with each FIFO deduplication id remembered for the window."""

    def add_message_once(queue: Any, message: Any) -> None:
        dedup_id = getattr(message, "deduplication_id", None)
        if queue.fifo_queue and dedup_id:
            sent_ms = int(message.sent_timestamp)
            seen: dict[str, int] = queue.__dict__.setdefault("_oncebox_dedup_sent", {})
            first = seen.get(dedup_id)
            if first is not None and sent_ms - first < DEDUP_WINDOW_S * 1000:
                return  # accepted, not delivered: AWS's answer to a copy within the window
            for old in [k for k, at in seen.items() if sent_ms - at >= DEDUP_WINDOW_S * 1000]:
                del seen[old]
            seen[dedup_id] = sent_ms
        add_message(queue, message)

    return add_message_once


def _behave_like_aws() -> None:
    from moto.sqs import models  # noqa: PLC0415 (the dev extra)

    with _patched:
        if not _done:
            models.Queue.add_message = _remembering(models.Queue.add_message)  # type: ignore[method-assign,assignment]
            _done.append(True)


@contextmanager
def sqs_server(*, credentials: str = "testing") -> Iterator[str]:
    """Start the server; its endpoint (`http://127.0.0.1:PORT`) while it runs."""
    try:
        from moto.server import ThreadedMotoServer  # noqa: PLC0415 (the dev extra)
    except ImportError:
        raise ConfigurationError(
            "no SQS-compatible server: install oncebox's dev extra (moto), or point oncebox at "
            "SQS with sqs://REGION?endpoint=URL"
        ) from None
    _behave_like_aws()
    for name, value in (
        ("AWS_ACCESS_KEY_ID", credentials),
        ("AWS_SECRET_ACCESS_KEY", credentials),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(name, value)  # read by boto3 here and in child processes
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()

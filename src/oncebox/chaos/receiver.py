"""The delivery webhooks' receiver served for a chaos run: uvicorn in a thread of the harness,
on a loopback socket bound before it starts (so the provider's first event queues on the socket
rather than finding nothing there)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from oncebox import Box


@contextmanager
def served_receiver(box: Box) -> Iterator[str]:
    """The receiver for `box`'s reporting channels until the block ends; its base URL."""
    import uvicorn  # noqa: PLC0415 (the console's extra)

    from oncebox.api.deliveries import create_receiver  # noqa: PLC0415 (starlette likewise)

    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.bind(("127.0.0.1", 0))
    listening.listen(128)
    port = listening.getsockname()[1]
    config = uvicorn.Config(create_receiver(box), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [listening]}, name="chaos-receiver", daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        listening.close()

"""What the fake HTTP servers share: a threaded server on loopback, served from a thread of its
own, started and stopped (a context manager), quiet about clients that gave up."""

from __future__ import annotations

import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (its timeout passed) before the answer is part of the act."""


class LoopbackServer:
    """The life cycle of a fake: `_listen` in its constructor, then `start` / `stop`. `stop`
    sets `_release` first, so answers a script holds back stop waiting."""

    host: str
    port: int
    _server: QuietServer
    _thread: threading.Thread
    _release: threading.Event

    def _listen(
        self, handler: type[BaseHTTPRequestHandler], host: str, tls: ssl.SSLContext | None = None
    ) -> None:
        self._release = threading.Event()
        self._server = QuietServer((host, 0), handler)
        if tls is not None:
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.host = str(self._server.server_address[0])
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

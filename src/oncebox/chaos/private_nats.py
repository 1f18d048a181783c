"""A NATS server of the harness's own, for the scenarios and tests that restart the broker.

The machine's NATS server is shared (other apps, the tests, a developer's session), so whatever
restarts one gets a private server: the machine's `nats-server`, a child process of this one
(no shell), on loopback and a free port, JetStream on, its store and log in a temporary folder.
A restart ends it with SIGTERM — JetStream then writes its streams' and consumers' state out as
it stops — and starts it again on the same port and store: streams on file storage keep their
messages, and a durable consumer remembers what it delivered and what is still unacknowledged.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from oncebox.chaos.private_broker import free_port, machine_program, port_answers
from oncebox.kernel import clock
from oncebox.kernel.errors import ConfigurationError

START_TIMEOUT_S = 60  # a loaded 2-core machine restoring a store: seconds, not minutes
STOP_TIMEOUT_S = 30
URL_OPTIONS = "ack_wait=2&wait=1"  # as the run's queue on the machine's server (chaos/broker.py)


def program() -> str:
    """The machine's nats-server; a machine without one is told so in one line, before a run
    or a test has started anything it would have to undo."""
    return machine_program(
        "nats-server",
        "a private NATS server to restart cannot be started (Debian's nats-server package "
        "installs it)",
    )


class PrivateNats:
    """See the module docstring. `server` is its bare address (`nats://127.0.0.1:PORT`); `url`
    adds the run's consumer options: a 2-second `ack_wait`, so that what a restart left
    unacknowledged comes back within the run."""

    def __init__(self) -> None:
        self.program = program()
        self.folder = Path(tempfile.mkdtemp(prefix="oncebox-chaos-nats-"))
        self.port = free_port()
        self.server = f"nats://127.0.0.1:{self.port}"
        self.url = f"{self.server}?{URL_OPTIONS}"
        self.log = self.folder / "nats-server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and return once its port answers (JetStream has restored its store by
        then: the server listens for clients only after)."""
        self.process = subprocess.Popen(  # noqa: S603 (the machine's own program, fixed arguments)
            [
                self.program, "-a", "127.0.0.1", "-p", str(self.port), "-js",
                "-sd", str(self.folder / "store"), "-l", str(self.log),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # its log is the file: no pipe to fill and block it
            stderr=subprocess.DEVNULL,
            cwd=self.folder,
        )  # fmt: skip
        deadline = clock.monotonic() + START_TIMEOUT_S
        while not port_answers(self.port):
            exited = self.process.poll()
            if exited is not None or clock.monotonic() > deadline:
                self.stop()
                said = f"exited {exited}" if exited is not None else "did not answer"
                raise ConfigurationError(
                    f"the private nats-server on port {self.port} {said} within "
                    f"{START_TIMEOUT_S} s: {self._log_tail()}"
                )
            clock.sleep(0.05)  # a child process booting: nothing to wait on but its answer

    def _log_tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return " | ".join(lines[-3:]) or "an empty log"

    def stop(self) -> None:
        """SIGTERM, so that JetStream stops cleanly; SIGKILL if it has not within
        `STOP_TIMEOUT_S`. Every connection to it is closed."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT_S)

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def private_nats() -> Iterator[PrivateNats]:
    server = PrivateNats()
    try:
        server.start()
        yield server
    finally:
        server.remove()

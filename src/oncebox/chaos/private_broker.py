"""A RabbitMQ node of the harness's own, for the scenarios that restart the broker.

The machine's broker is shared (other apps, the tests, a developer's session), so a scenario that
restarts one gets a private node: the machine's `rabbitmq-server`, started detached under a node
name of its own (`oncebox-chaos-<hex>@localhost`) with its AMQP and distribution ports free
ports, its data, logs, plugins list (none) and configuration in a temporary folder, and stopped
with `rabbitmqctl -n NODE stop` — by name, so the shared node is never the one addressed. A
restart stops and starts it on the same folder: its quorum queues keep their messages.

RabbitMQ's command-line tools take ports 35672-35682 (the shared node's distribution port plus
10 000); a free port in that range is skipped.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from oncebox.kernel import clock
from oncebox.kernel.errors import ConfigurationError

CLI_PORTS = range(35672, 35683)
START_TIMEOUT_S = 90


def free_port() -> int:
    """A free loopback port (outside RabbitMQ's command-line range: see the module docstring)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port not in CLI_PORTS:
            return port


def port_answers(port: int) -> bool:
    """Whether a server accepts connections on the loopback `port`."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


def machine_program(name: str, missing: str) -> str:
    """The machine's `name` (Debian puts servers in /usr/sbin, off a user's PATH); else a
    one-line `ConfigurationError`: `missing` says what cannot be done and what installs it."""
    sbin = Path("/usr/sbin") / name
    found = shutil.which(name) or (str(sbin) if sbin.exists() else None)
    if found is None:
        raise ConfigurationError(f"no {name} on this machine: {missing}")
    return found


def _program(name: str) -> str:
    return machine_program(
        name,
        "a private RabbitMQ node for the broker-restart scenario cannot be started (make "
        "system-packages installs rabbitmq-server)",
    )


class PrivateBroker:
    """See the module docstring. `url` is its AMQP URL (guest over loopback)."""

    def __init__(self) -> None:
        self.server = _program("rabbitmq-server")
        self.ctl = _program("rabbitmqctl")
        self.folder = Path(tempfile.mkdtemp(prefix="oncebox-chaos-broker-"))
        self.node = f"oncebox-chaos-{secrets.token_hex(4)}@localhost"
        self.port = free_port()
        self.dist_port = free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"
        # the server may run as the rabbitmq user (Debian's wrapper switches to it as root)
        self.folder.chmod(0o777)
        for name, text in (
            ("rabbitmq.conf", ""),
            ("enabled_plugins", "[].\n"),
            ("rabbitmq-env.conf", "ERL_EPMD_ADDRESS=127.0.0.1\n"),
        ):
            path = self.folder / name
            path.write_text(text)
            path.chmod(0o666)

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "RABBITMQ_CONF_ENV_FILE": str(self.folder / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(self.folder / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
        }

    def start(self) -> None:
        subprocess.run(  # noqa: S603 (the machine's own program, fixed arguments)
            [self.server, "-detached"],
            env=self._env(),
            cwd=self.folder,
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = clock.monotonic() + START_TIMEOUT_S
        while True:  # the node answers only once it booted; until then the CLI says so
            answered = subprocess.run(  # noqa: S603
                [self.ctl, "-n", self.node, "await_startup", "--timeout", "10"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if answered.returncode == 0 and port_answers(self.port):
                return
            if clock.monotonic() > deadline:
                raise ConfigurationError(
                    f"the private RabbitMQ node {self.node} did not start within "
                    f"{START_TIMEOUT_S} s (its log: {self.folder / 'log'})"
                )
            clock.sleep(0.5)  # a child process booting: nothing to wait on but its answer

    def stop(self) -> None:
        subprocess.run(  # noqa: S603
            [self.ctl, "-n", self.node, "stop"],
            capture_output=True,
            timeout=120,
            check=False,
        )

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def private_broker() -> Iterator[PrivateBroker]:
    broker = PrivateBroker()
    try:
        broker.start()
        yield broker
    finally:
        broker.remove()

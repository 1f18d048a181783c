"""A PostgreSQL server of the harness's own, for the scenarios that restart one.

A chaos run never restarts a server it was pointed at: that server is shared (other databases,
other users, a developer's session). A scenario that needs a restart gets a private instance
instead: `initdb` into a temporary folder, `pg_ctl start` on a free port with its socket in that
folder, trust authentication on loopback only, and `pg_ctl stop` and the folder removed
afterwards. The binaries are the machine's own (`pg_config --bindir`, or the newest under
/usr/lib/postgresql); as root, they run as the `postgres` user, which PostgreSQL requires.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from oncebox.kernel.errors import ConfigurationError


def bindir() -> Path:
    """Where the machine's PostgreSQL server programs are."""
    config = shutil.which("pg_config")
    if config:
        found = subprocess.run(  # noqa: S603 (a fixed program found on PATH)
            [config, "--bindir"], capture_output=True, text=True, check=False, timeout=30
        ).stdout.strip()
        if found and (Path(found) / "initdb").exists():
            return Path(found)
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3])
    )
    if not versions:
        raise ConfigurationError(
            "no PostgreSQL server programs on this machine (initdb, pg_ctl): a private server "
            "for the restart scenarios cannot be started"
        )
    return versions[-1].parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrivateServer:
    """See the module docstring. `url` names its `postgres` database, through which a run's
    workspace creates the run's own."""

    def __init__(self) -> None:
        self.bin = bindir()
        self.folder = Path(tempfile.mkdtemp(prefix="oncebox-chaos-server-"))
        self.data = self.folder / "data"
        self.port = _free_port()
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.folder, entry.pw_uid, entry.pw_gid)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bin / program), *args]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        done = subprocess.run(  # noqa: S603 (the machine's own PostgreSQL programs)
            command, capture_output=True, text=True, check=False, timeout=120, cwd=self.folder
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{program} {' '.join(args[:3])} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-400:]}"
            )

    def start(self) -> None:
        if not self.data.exists():
            self._run(
                "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync",
                "-E", "UTF8", "--locale", "C",
            )  # fmt: skip
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.folder / "server.log")  # the server's output: not our pipes, which it
        self._run(  # would hold open after pg_ctl returns
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "-t", "60", "start"
        )

    def restart(self) -> None:
        """A real restart: every connection to it dies; it answers again when this returns."""
        log = str(self.folder / "server.log")
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", log, "-m", "fast", "-w", "-t", "60", "restart"
        )

    def stop(self, mode: str = "immediate") -> None:
        """Stopped as by a crash (`immediate`: what was not yet flushed is lost), or as by an
        operator (`fast`: every connection ended, everything committed kept)."""
        if self.data.exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")


@contextmanager
def private_server() -> Iterator[PrivateServer]:
    server = PrivateServer()
    try:
        server.start()
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(server.folder, ignore_errors=True)

"""A PgBouncer of the test's own, in transaction pooling, in front of the test server.

Debian's `pgbouncer` (installed by `make test`), started on a free port with a configuration in a
temporary folder and stopped afterwards: the machine's own PgBouncer, if any, is never touched.
As root it runs as the `postgres` user (PgBouncer refuses to run as root). Authentication is
`trust`, for the one role the test server's URL connects as.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from oncebox.fakes.smtp_sink import free_port
from support.binaries import require

CONFIG = """\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 200
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
"""


def _program() -> str:
    on_path = shutil.which("pgbouncer")
    if on_path is None and Path("/usr/sbin/pgbouncer").exists():  # a non-root PATH lacks sbin
        return "/usr/sbin/pgbouncer"
    return on_path or require("pgbouncer", "pgbouncer")


@contextmanager
def pgbouncer(server_url: str, *, pool_size: int) -> Iterator[str]:
    """A PgBouncer with `pool_size` server connections per database and role; yields the
    server's URL rewritten to go through it."""
    program = _program()
    target = psycopg.conninfo.conninfo_to_dict(server_url)
    with psycopg.connect(server_url) as probe:
        role = str(probe.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]
    folder = Path(tempfile.mkdtemp(prefix="oncebox-pgbouncer-"))
    listen = free_port()
    (folder / "users.txt").write_text(f'"{role}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        CONFIG.format(
            host=target.get("host") or "127.0.0.1",
            port=target.get("port") or 5432,
            listen=listen,
            folder=folder,
            pool_size=pool_size,
        )
    )
    command = [program, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        for path in (folder, *folder.iterdir()):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        command = [program, "-u", "postgres", str(folder / "pgbouncer.ini")]  # its own switch
    with (folder / "output.txt").open("wb") as output:  # its log also goes to stderr
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    through = psycopg.conninfo.make_conninfo(server_url, host="127.0.0.1", port=str(listen))
    url = _as_url(through)
    try:
        _wait_until_it_answers(url, process, folder)
        yield url
    finally:
        process.send_signal(signal.SIGINT)  # PgBouncer's immediate shutdown
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _as_url(conninfo: str) -> str:
    parts = psycopg.conninfo.conninfo_to_dict(conninfo)
    user = f"{parts['user']}@" if parts.get("user") else ""
    return f"postgresql://{user}{parts['host']}:{parts['port']}/{parts['dbname']}"


def _wait_until_it_answers(url: str, process: subprocess.Popen[bytes], folder: Path) -> None:
    """Until PgBouncer accepts a connection and passes a query through (it listens a moment
    after it starts); its log if it exits or does not within 30 s."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with psycopg.connect(url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            if process.poll() is not None or time.monotonic() > deadline:
                said = (folder / "output.txt").read_text(errors="replace")
                raise RuntimeError(f"PgBouncer did not start: {said[-800:]}") from None
            time.sleep(0.05)  # polling for a server to listen, within the deadline above

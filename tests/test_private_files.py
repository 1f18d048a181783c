"""What oncebox writes to disk is private by default: the SQLite database and its `-wal`/`-shm`
files hold the outbox secret and every rendered message, and the `file://` outbox holds the
messages themselves — readable by their owner only, whatever the process's umask, unless an
operator chose otherwise (an existing database keeps its mode; `file://dir?mode=0750` opens the
outbox to a group). A failed write leaves nothing behind."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from oncebox import Box
from oncebox.kernel.errors import ConfigurationError
from oncebox.providers import Outgoing, from_url
from oncebox.providers.base import SendPermanent
from oncebox.providers.email_payload import email_payload
from oncebox.providers.local import FileProvider


@pytest.fixture(autouse=True)
def common_umask() -> Iterator[None]:
    previous = os.umask(0o022)  # world-readable by default: what the files must not inherit
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def outgoing(subject: str = "Your shipments") -> Outgoing:
    payload = email_payload(
        to="ops@customer.example", subject="s", text="t", html=None, headers=None,
        sender="d@x.example", reply_to=None, date=datetime(2026, 8, 17, 9, tzinfo=UTC),
    )  # fmt: skip
    return Outgoing(7, "email", "tok7", {**payload, "subject": subject}, 1)


def test_a_new_sqlite_database_and_its_log_files_are_private(tmp_path):
    path = tmp_path / "freight.db"
    box = Box(f"sqlite:///{path}")
    try:
        box.init_secret()
        files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
        assert all(file.exists() for file in files)
        assert {file.name: mode(file) for file in files} == {file.name: 0o600 for file in files}
    finally:
        box.close()


def test_an_existing_database_keeps_the_mode_its_operator_gave_it(tmp_path):
    path = tmp_path / "freight.db"
    Box(f"sqlite:///{path}").close()
    path.chmod(0o640)
    box = Box(f"sqlite:///{path}")
    try:
        box.init_secret()
        assert mode(path) == 0o640
    finally:
        box.close()


def test_the_file_outbox_folder_and_messages_are_private(tmp_path):
    provider = from_url(f"file://{tmp_path / 'mail'}")
    provider.send(outgoing(), "key")
    assert mode(tmp_path / "mail") == 0o700
    assert [mode(file) for file in (tmp_path / "mail").iterdir()] == [0o600]


def test_the_file_outbox_mode_is_configurable_for_a_separate_reader(tmp_path):
    provider = from_url(f"file://{tmp_path / 'mail'}?mode=0750")
    provider.send(outgoing(), "key")
    assert mode(tmp_path / "mail") == 0o750
    assert [mode(file) for file in (tmp_path / "mail").iterdir()] == [0o640]


@pytest.mark.parametrize(
    ("query", "needle"),
    [("mode=0777", "writable by others"), ("mode=0600", "owner"), ("mode=rw", "octal"),
     ("mode=", "octal"), ("mood=0700", "unknown")],
)  # fmt: skip
def test_a_bad_outbox_mode_is_refused(tmp_path, query, needle):
    with pytest.raises(ConfigurationError, match=needle):
        from_url(f"file://{tmp_path / 'mail'}?{query}")


def test_a_message_that_cannot_be_rendered_leaves_no_file_behind(tmp_path):
    provider = FileProvider(tmp_path / "mail")
    (tmp_path / "mail").mkdir()
    with pytest.raises(SendPermanent):
        provider.send(outgoing("Your shipments\u2028Bcc: x@evil.example"), "key")
    assert list((tmp_path / "mail").iterdir()) == []

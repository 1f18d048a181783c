"""Text that users and providers wrote is inert when the CLI shows it: a hostile text goes
through every stored text field (job arguments, a handler's error, a provider's reply, a
message's payload, a receipt, reasons and actors) and every command that prints it, and no
terminal control survives — OSC 52 (the clipboard), OSC 8 (links), CSI (the screen), a bare
carriage return, C1 controls, bidirectional overrides — while `--json` keeps the text exact."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from oncebox import Box, JobContext, Retry
from oncebox.providers import Outgoing, Receipt
from oncebox.providers.base import SendPermanent
from test_cli import oncebox

HOSTILE = (
    "\x1b]52;c;ZXZpbA==\x07 \x1b]8;;https://evil.example\x07click\x1b]8;;\x07 "
    "\x1b[2J\x1b[31m \u202eevil\u202c \rover \x9b31m \x9d0;t\x9c \x07"
)
CONTROLS = ["\x1b", "\x07", "\r", "\x9b", "\x9d", "\x9c", "\u202e", "\u202c"]


class RefusingProvider:
    """A provider whose reply is the hostile text."""

    name = "refusing"
    idempotent = False
    idempotency_window: timedelta | None = None

    def send(self, outgoing: Outgoing, idempotency_key: str) -> Receipt:
        raise SendPermanent(f"550 {HOSTILE}")


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('inert') / 'hostile.db'}"
    box = Box(url)
    try:
        box.init_secret()
        box.channel("webhook", provider=RefusingProvider())

        @box.task(key="note/{n}", retry=Retry(max_attempts=1))
        def note(ctx: JobContext, n: int, text: str) -> None:
            if n == 1:
                raise ValueError(f"handler says {HOSTILE}")
            ctx.outbox.add("webhook", {"body": HOSTILE})

        box.enqueue(note, n=1, text=HOSTILE)
        box.enqueue(note, n=2, text=HOSTILE)
        box.enqueue(note, n=3, text=HOSTILE, delay=timedelta(hours=1))
        box.work(until_idle=True)
        box.cancel("note/3", reason=f"why: {HOSTILE}", actor=f"who {HOSTILE}")
        box.replay("note/2", reason=HOSTILE, actor=HOSTILE)  # the message, dead
    finally:
        box.close()
    return url


COMMANDS = [
    ("jobs", "list"),
    ("jobs", "show", "note/1"),
    ("jobs", "show", "3"),
    ("dlq", "list"),
    ("dlq", "show", "note/1"),
    ("dlq", "replay", "--all", "--dry-run"),
    ("dlq", "discard", "--all", "--dry-run"),
    ("outbox", "list"),
    ("outbox", "show", "note/2"),
    ("audit", "list"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_that_prints_stored_text_prints_it_inert(hostile_db, command):
    result = oncebox(*command, env={"ONCEBOX_DB": hostile_db})
    assert result.returncode == 0, result.stderr
    shown = result.stdout + result.stderr
    assert re.search(r"\\(x1b|u001b)\]52;c;", shown), shown  # the hostile field is printed
    for control in CONTROLS:
        assert control not in shown, (control, shown)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_json_output_keeps_the_stored_text_exact(hostile_db, command):
    result = oncebox(*command, "--json", env={"ONCEBOX_DB": hostile_db})
    assert result.returncode == 0, result.stderr
    assert any(HOSTILE in text for text in strings(json.loads(result.stdout)))


def strings(data: object) -> Iterator[str]:
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        for value in data.values():
            yield from strings(value)
    elif isinstance(data, list):
        for value in data:
            yield from strings(value)


def test_the_worker_log_shows_a_handler_error_inert(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'w.db'}"
    (tmp_path / "hostile_app.py").write_text(
        "from oncebox import Box, Retry\n"
        "box = Box()\n"
        "@box.task(key='note/{n}', retry=Retry(max_attempts=1))\n"
        "def note(ctx, n: int) -> None:\n"
        f"    raise ValueError({HOSTILE!r})\n"
    )
    env = {"ONCEBOX_DB": url, "ONCEBOX_APP": "hostile_app", "ONCEBOX_SECRET": "s" * 32}
    assert oncebox("enqueue", "note", "n=1", env=env, cwd=tmp_path).returncode == 0
    result = oncebox("-v", "worker", "--until-idle", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "\\x1b]52" in result.stderr, result.stderr
    for control in CONTROLS:
        assert control not in result.stdout + result.stderr, control

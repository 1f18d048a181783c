"""Every example runs as its README says, from a clone to the result. The README's marked `sh`
blocks run verbatim, in order, in one bash session — a new user's terminal — in a copy of
`examples/` beside the project's environment as `.venv` (what `make .venv/.installed` builds;
the README's first, unmarked step). What each README shows a command printing must be what it
prints. The test gives each session a free port and, on PostgreSQL, a database of its own, only
through the variables the README itself exports (`support.readme_session`)."""

from __future__ import annotations

import getpass
import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from email import message_from_bytes
from email.message import Message
from pathlib import Path

import psycopg
import pytest

from conftest import PG_URL, REQUIRE_PG
from oncebox.fakes.smtp_sink import free_port
from support.binaries import require
from support.readme_session import session, steps, substitute

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RUN_BY_THIS_FILE = {"django_bookings", "fastapi_bookings", "flask_signups"}
SESSION_ONLY = ("ONCEBOX_", "PG", "BOOKINGS_", "SIGNUPS_", "DJANGO_")
NOT_INHERITED = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "BASH_ENV", "PORT"}


def clone(tmp_path: Path) -> Path:
    """What a reader's clone holds as far as an example goes: `examples/`, and `.venv` (this
    interpreter's environment: the project installed with its extras)."""
    root = tmp_path / "oncebox"
    shutil.copytree(
        EXAMPLES,
        root / "examples",
        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.db", "*.db-*", "outbox"),
    )
    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").exists():
        pytest.skip(f"{venv} is not a virtual environment: the READMEs activate `.venv`")
    (root / ".venv").symlink_to(venv)
    return root


def terminal_environment() -> dict[str, str]:
    """A fresh terminal's: nothing a README sets, and this environment's `bin` off the PATH
    (the README activates it); unbuffered, so output arrives as it would on a terminal."""
    venv_bin = str(Path(sys.prefix) / "bin")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(SESSION_ONLY) and k not in NOT_INHERITED
    }
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_readme(
    example: str, tmp_path: Path, values: dict[str, str], env: dict[str, str] | None = None
) -> Path:
    """Run the example's README in a new clone; returns the clone's root."""
    require("curl", "curl")
    found = steps(EXAMPLES / example / "README.md")
    assert found, f"examples/{example}/README.md marks no commands to run"
    root = clone(tmp_path)
    scripts = tmp_path / "steps"
    scripts.mkdir()
    with session(root, {**terminal_environment(), **(env or {})}, scripts, values) as shell:
        for number, step in enumerate(substitute(found, values), 1):
            shell.run(step, number)
    return root


def emails(outbox: Path) -> list[Message]:
    return [message_from_bytes(p.read_bytes()) for p in sorted(outbox.glob("*.eml"))]


@pytest.fixture
def postgres() -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """The README's PostgreSQL variables for the test's server and a database name no other
    test uses (the README creates it; dropped here whatever happened), and PGPASSWORD if any."""
    try:
        admin = psycopg.connect(PG_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        message = f"PostgreSQL at {PG_URL} is unreachable: {str(exc).strip()}"
        if REQUIRE_PG:
            pytest.fail(message)
        pytest.skip("!!! SKIPPING POSTGRESQL TESTS !!! " + message)
    require("createdb", "postgresql-client")
    parts = psycopg.conninfo.conninfo_to_dict(PG_URL)
    name = f"oncebox_readme_{uuid.uuid4().hex[:12]}"
    values = {
        "PGHOST": str(parts.get("host") or "127.0.0.1"),
        "PGPORT": str(parts.get("port") or 5432),
        "PGUSER": str(parts.get("user") or getpass.getuser()),
        "PGDATABASE": name,
    }
    password = {"PGPASSWORD": str(parts["password"])} if parts.get("password") else {}
    with admin:
        try:
            yield values, password
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


@pytest.mark.slow
@pytest.mark.postgres
def test_the_fastapi_example_runs_as_its_readme_says(tmp_path, postgres):
    values, password = postgres
    root = run_readme("fastapi_bookings", tmp_path, {**values, "PORT": str(free_port())}, password)
    [mail] = emails(root / "outbox")
    assert (mail["To"], mail["Subject"]) == ("ada@example.com", "Your room hold has expired")


@pytest.mark.slow
def test_the_flask_example_runs_as_its_readme_says(tmp_path):
    root = run_readme("flask_signups", tmp_path, {"PORT": str(free_port())})
    [mail] = emails(root / "outbox")
    assert (mail["To"], mail["Subject"]) == ("ada@example.com", "Welcome aboard")


@pytest.mark.slow
def test_the_django_example_runs_as_its_readme_says(tmp_path):
    root = run_readme("django_bookings", tmp_path, {"PORT": str(free_port())})
    [mail] = emails(root / "examples" / "django_bookings" / "outbox")
    assert (mail["To"], mail["Subject"]) == ("ada@example.com", "Your room hold has expired")


def test_every_example_has_a_readme_this_file_runs_and_the_index_lists():
    examples = {p.name for p in EXAMPLES.iterdir() if p.is_dir() and p.name[0] not in "._"}
    index = (EXAMPLES / "README.md").read_text()
    assert examples == RUN_BY_THIS_FILE, "a new example needs a README and a test here"
    for name in sorted(examples):
        assert steps(EXAMPLES / name / "README.md"), f"examples/{name}/README.md runs nothing"
        assert f"({name}/README.md)" in index, f"examples/README.md does not link {name}"


def test_a_readme_named_in_an_examples_code_exists():
    named = [
        (source, match)
        for source in EXAMPLES.rglob("*.py")
        for match in re.findall(r"\b[\w/.]*README\.md\b", source.read_text())
    ]
    assert named, "the examples' modules point their readers to their README"
    missing = [f"{s.relative_to(EXAMPLES)}: {m}" for s, m in named if not (s.parent / m).exists()]
    assert not missing, missing


def test_a_failing_command_fails_its_block_and_a_wrong_exit_code_too(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        '<!-- run -->\n```sh\nexport GREETING=hi\nfalse\necho "$GREETING"\n```\n'
        "<!-- run: exits 3 -->\n```sh\n(exit 4)\n```\n"
    )
    found = steps(readme)
    assert [(s.exits, s.serves) for s in found] == [(0, None), (3, None)]
    (tmp_path / "steps").mkdir()
    with session(tmp_path, terminal_environment(), tmp_path / "steps", {}) as shell:
        with pytest.raises(AssertionError, match=r"should exit 0; failed: \[\(1, 'false'\)\]"):
            shell.run(found[0], 1)
        with pytest.raises(AssertionError, match=r"should exit 3; failed: \[\(4, "):
            shell.run(found[1], 2)


def test_an_output_the_readme_shows_must_be_printed_and_a_value_substituted_once(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        '<!-- run -->\n```sh\nexport WHO=world\necho "hello $WHO"\n```\n\n'
        "<!-- output -->\n```\nhello world\n```\n"
    )
    [step] = steps(readme)
    assert step.shown == "hello world\n"
    with pytest.raises(AssertionError, match="export each of these once"):
        substitute([step], {"NOBODY": "x"})
    [changed] = substitute([step], {"WHO": "reader"})
    assert changed.text.startswith("export WHO=reader\n")
    (tmp_path / "steps").mkdir()
    with session(tmp_path, terminal_environment(), tmp_path / "steps", {}) as shell:
        assert "hello world" in shell.run(step, 1)
        with pytest.raises(AssertionError, match=r"printed none of \['hello world'\]"):
            shell.run(changed, 2)


def test_steps_refuse_an_unknown_marker(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- run: later -->\n```sh\ntrue\n```\n")
    with pytest.raises(AssertionError, match="unknown run marker 'later'"):
        steps(readme)

"""oncebox installed without its extras (`pip install oncebox`, or with one extra alone): every
command starts, the core commands and the README's example run, and a command that needs a
missing extra says which one to install, in one line, exit 2 — never a ModuleNotFoundError.

Each check runs in a process that cannot import the extras' modules (support/without_extras),
so this suite, which has every extra installed, sees what such an install sees. The real
installs, from the built wheel, are tests/test_install.py's (`make install-test`)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import oncebox as package_under_test
from test_readme import readme_example

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CODE = Path(package_under_test.__file__ or "").resolve().parent.parent
EXAMPLE_DJANGO = ROOT / "examples" / "django_bookings"
#: what users bring to the integrations oncebox offers without an extra of its own
INTEGRATIONS = ("alembic", "flask")


def extras() -> dict[str, list[str]]:
    """pyproject.toml's extras (all but `dev`): name -> the distributions it installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    named = project["optional-dependencies"]
    return {
        extra: [re.split(r"[\[<>=!~ ;]", req, maxsplit=1)[0].lower() for req in reqs]
        for extra, reqs in named.items()
        if extra != "dev"
    }


def modules_of(extra_names: list[str]) -> set[str]:
    """The top-level modules the extras' distributions install (this suite has them all)."""
    wanted = {d for name in extra_names for d in extras()[name]}
    return {
        module
        for module, dists in importlib.metadata.packages_distributions().items()
        if wanted & {d.lower() for d in dists}
    }


def hidden_except(*kept: str) -> str:
    hidden = modules_of([e for e in extras() if e not in kept]) | set(INTEGRATIONS)
    hidden -= modules_of(list(kept))  # fastapi and sqlalchemy share sqlalchemy
    return " ".join(sorted(hidden))


def run(
    args: list[str],
    cwd: Path,
    *,
    kept: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    path: tuple[Path, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in a process without the extras' modules (but those of `kept`)."""
    paths = [TESTS / "support" / "without_extras", TESTS, CODE, *path]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("ONCEBOX_", "DJANGO_"))}
    full_env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    full_env["ONCEBOX_TEST_HIDDEN"] = hidden_except(*kept)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def oncebox(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run(["-m", "oncebox", *args], cwd)


def assert_clean(done: subprocess.CompletedProcess[str], what: str) -> None:
    assert done.returncode == 0, f"{what}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, f"{what}:\n{done.stderr}"


def test_the_hidden_modules_are_the_extras_and_nothing_of_the_core():
    hidden = set(hidden_except().split())
    assert {"starlette", "uvicorn", "sqlalchemy", "fastapi", "django"} <= hidden, hidden
    assert {"opentelemetry", "pika", "boto3", "nats", "alembic", "flask"} <= hidden, hidden
    assert not hidden & {"click", "psycopg", "jinja2", "prometheus_client", "oncebox"}, hidden


LIST_EVERY_COMMAND = """
import contextlib, io, json, sys, traceback
import click
from oncebox.cli import main

def commands(group, path):
    for name, command in sorted(group.commands.items()):
        yield [*path, name]
        if isinstance(command, click.Group):
            yield from commands(command, [*path, name])

results = {}
for argv in [[], *commands(main, [])]:
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main.main(args=[*argv, "--help"], prog_name="oncebox")
        code = 0
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        code = traceback.format_exc().strip().splitlines()[-1]
    results[" ".join(argv)] = [code, err.getvalue().strip()]
print(json.dumps(results))
"""


def test_every_command_shows_its_help_without_the_extras(tmp_path):
    done = run(["-c", LIST_EVERY_COMMAND], tmp_path)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert {"", "worker", "status", "console", "serve", "api-keys create"} <= set(results)
    failed = {argv: why for argv, why in results.items() if why != [0, ""]}
    assert not failed, failed


def test_a_worker_works_the_readme_example_without_the_extras(tmp_path):
    (tmp_path / "freight.py").write_text(readme_example())
    assert_clean(run(["freight.py"], tmp_path), "python freight.py")
    db = f"sqlite:///{tmp_path / 'oncebox.db'}"
    assert_clean(oncebox("status", "--db", db, cwd=tmp_path), "oncebox status")
    worker = oncebox("worker", "--app", "freight", "--db", db, "--until-idle", cwd=tmp_path)
    assert_clean(worker, "oncebox worker")
    assert "worker stopped: 0 completed" in worker.stdout, worker.stdout


@pytest.mark.parametrize(
    "command",
    [["console"], ["serve", "--app", "support.cli_app"], ["receive", "--app", "support.cli_app"]],
    ids=["console", "serve", "receive"],
)
def test_a_web_command_without_the_console_extra_names_it_in_one_line(tmp_path, command):
    db = f"sqlite:///{tmp_path / 'oncebox.db'}"
    assert_clean(oncebox("migrate", "--db", db, cwd=tmp_path), "oncebox migrate")
    done = oncebox(*command, "--db", db, cwd=tmp_path)
    assert done.returncode == 2, (done.returncode, done.stderr)
    [line] = done.stderr.strip().splitlines()
    assert "pip install 'oncebox[console]'" in line, line


def test_the_library_names_the_extra_a_configuration_needs(tmp_path):
    script = """
from oncebox import Box, ConfigurationError
box = Box("sqlite:///lib.db")
box.queue("parcels", broker="amqp://127.0.0.1:5672/%2F")

@box.task(key="parcel/{n}", queue="parcels")
def parcel(ctx, n: int) -> None: ...

for attempt in (box.use_sqlalchemy, lambda: box.publish_unrecorded(parcel, n=1)):
    try:
        attempt()
    except ConfigurationError as exc:
        print(exc)
"""
    done = run(["-c", script], tmp_path)
    assert done.returncode == 0, done.stderr
    sqlalchemy, rabbitmq = done.stdout.strip().splitlines()
    assert "pip install 'oncebox[sqlalchemy]'" in sqlalchemy, sqlalchemy
    assert "pip install 'oncebox[rabbitmq]'" in rabbitmq, rabbitmq


def test_django_projects_commands_run_with_the_django_extra_alone(tmp_path):
    env = {
        "BOOKINGS_DB": f"sqlite:///{tmp_path / 'bookings.db'}",
        "ONCEBOX_EMAIL": f"file://{tmp_path / 'outbox'}",
    }

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return run(
            ["manage.py", *args], EXAMPLE_DJANGO, kept=("django",), env=env, path=(EXAMPLE_DJANGO,)
        )

    assert_clean(manage("migrate", "--verbosity", "0"), "manage.py migrate")
    worker = manage("oncebox_worker", "--until-idle")
    assert_clean(worker, "manage.py oncebox_worker")
    assert "worker stopped: 0 completed" in worker.stdout, worker.stdout

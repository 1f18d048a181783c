"""oncebox as users install it: the sdist and the wheel built as a release builds them (the wheel
from the sdist), the wheel installed by pip into a fresh virtual environment — without extras,
and with each extra alone — and, in each, the commands a newcomer runs first: `oncebox --help`,
`python -m oncebox`, the README's twenty-line example, a small `oncebox demo`, a worker on the
demo's database, and the extra's own command. Without an extra, what needs it says which one to
install, in one line, exit 2.

`make install-test` (a step of `make test`, after the suite) runs this file; the suite's own run
deselects it (marker `install`). The wheelhouse is downloaded once from the index; every install
then reads it alone (`--no-index`)."""

from __future__ import annotations

import email
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from support.brokers import AMQP_URL, NATS_URL, reachable, sqs_url
from support.console_browser import free_port
from support.waiting import wait_until
from test_example_django import ENQUEUE
from test_readme import readme_example, readme_output

pytestmark = [pytest.mark.install, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = sorted(e for e in PYPROJECT["optional-dependencies"] if e != "dev")
DEMO_APP = "from oncebox.examples.logistics.app import build_box\n\nbox = build_box()\n"
DEMO_DB = "sqlite:///oncebox-demo.db"
UV = str(Path(sys.executable).with_name("uv"))  # the dev extra's
Check = Callable[["Venv", pytest.FixtureRequest], None]  # what an install runs for its extra


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path
    wheelhouse: Path


@contextmanager
def locked(path: Path) -> Iterator[None]:
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def checked(args: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)
    assert done.returncode == 0, f"{' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Dist:
    """The sdist, the wheel built from it, and a wheelhouse with every extra's distributions:
    made once per run, whichever of xdist's workers asks first."""
    base = tmp_path_factory.getbasetemp()
    shared = base if worker_id == "master" else base.parent  # xdist's workers share the parent
    out = shared / "install-dist"
    with locked(shared / "install-dist.lock"):
        if not (out / "done").exists():
            shutil.rmtree(out, ignore_errors=True)
            # no isolation: the dev environment's setuptools (>= 77), nothing downloaded
            checked(
                [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), "."],
                cwd=ROOT,
            )
            [wheel] = out.glob("oncebox-*.whl")
            checked(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--only-binary",
                    ":all:",
                    "--dest",
                    str(out / "wheelhouse"),
                    f"{wheel}[{','.join(EXTRAS)}]",
                ]
            )
            (out / "done").touch()
    [wheel] = out.glob("oncebox-*.whl")
    [sdist] = out.glob("oncebox-*.tar.gz")
    return Dist(wheel, sdist, out / "wheelhouse")


@dataclass(frozen=True)
class Venv:
    """A fresh virtual environment holding the wheel (with `extra`), and a folder to work in."""

    extra: str | None
    bin: Path
    work: Path

    def run(
        self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        full = {k: v for k, v in os.environ.items() if not k.startswith(("ONCEBOX_", "PYTHON"))}
        full.pop("DJANGO_SETTINGS_MODULE", None)
        full.update(env or {})
        program = str(self.bin / args[0]) if (self.bin / args[0]).exists() else args[0]
        return subprocess.run(
            [program, *args[1:]],
            cwd=cwd or self.work,
            env=full,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )

    def ok(self, *args: str, **kwargs) -> subprocess.CompletedProcess[str]:
        done = self.run(*args, **kwargs)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (
            f"[{self.extra or 'no extras'}] `{' '.join(args)}` exit {done.returncode}\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
        return done

    def one_line(self, extra: str, *args: str) -> str:
        """`args` fails with one line naming `extra` to install, exit 2, no traceback."""
        done = self.run(*args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (
            f"[{self.extra or 'no extras'}] `{' '.join(args)}` exit {done.returncode}, "
            f"expected 2 and one line:\n{done.stderr[-3000:]}"
        )
        assert f"pip install 'oncebox[{extra}]'" in lines[0], lines[0]
        return lines[0]


def installed(dist: Dist, extra: str | None, tmp_path: Path) -> Venv:
    """`pip install oncebox` into a new environment, as the README says; `'oncebox[extra]'` by
    uv's pip (the same wheels, ten times faster); both from the wheelhouse alone."""
    env = tmp_path / "venv"
    python = str(env / "bin" / "python")
    source = ["--no-index", "--find-links", str(dist.wheelhouse)]
    if extra is None:
        checked([sys.executable, "-m", "venv", "--without-pip", str(env)])
        pip = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet", *source]
        checked([*pip, str(dist.wheel)])
    else:
        checked([UV, "venv", "--quiet", "--python", sys.executable, str(env)])
        uv_pip = [UV, "pip", "install", "--quiet", "--offline", "--python", python, *source]
        checked([*uv_pip, f"{dist.wheel}[{extra}]"])
    work = tmp_path / "work"
    work.mkdir()
    return Venv(extra, env / "bin", work)


@pytest.fixture(params=[None, *EXTRAS], ids=["no-extras", *EXTRAS])
def venv(request: pytest.FixtureRequest, dist: Dist, tmp_path: Path) -> Iterator[Venv]:
    made = installed(dist, request.param, tmp_path)
    yield made
    shutil.rmtree(tmp_path / "venv", ignore_errors=True)  # hundreds of MB each


# -- what every install runs ----------------------------------------------------------------------


def first_steps(venv: Venv) -> None:
    """`oncebox --help`, `python -m oncebox --help`, the README's example (its output as the
    README shows it), a small demo and a worker on the demo's database. The demo injects its
    faults (a worker killed mid-send among them) once, without extras; elsewhere it runs plain."""
    assert "worker" in venv.ok("oncebox", "--help").stdout
    assert venv.ok("python", "-m", "oncebox", "--help").stdout.startswith(
        "Usage: python -m oncebox"
    )
    (venv.work / "freight.py").write_text(readme_example())
    example = venv.ok("python", "freight.py")
    expected = readme_output()
    assert example.stderr.strip() == expected[0].replace("/home/me/freight", str(venv.work))
    assert example.stdout.splitlines() == expected[1:]
    faults = [] if venv.extra is None else ["--no-faults"]
    demo = venv.ok("oncebox", "demo", "--customers", "3", *faults)
    assert "invariants hold" in demo.stdout, demo.stdout[-2000:]
    (venv.work / "freightapp.py").write_text(DEMO_APP)
    worker = venv.ok("oncebox", "worker", "--app", "freightapp", "--db", DEMO_DB, "--until-idle")
    assert "worker stopped:" in worker.stdout, worker.stdout


# -- each extra's own command ---------------------------------------------------------------------


def get(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(url, headers=headers, timeout=10)
    return response.status_code, response.text


@contextmanager
def serving(venv: Venv, *args: str) -> Iterator[str]:
    """`oncebox ARGS --bind 127.0.0.1:PORT` running; its base URL while it serves."""
    port = free_port()
    process = subprocess.Popen(
        [str(venv.bin / "oncebox"), *args, "--bind", f"127.0.0.1:{port}"],
        cwd=venv.work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"

    def answering() -> bool:
        assert process.poll() is None, process.communicate()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return False
        return True

    try:
        wait_until(answering, timeout=60, what=f"`oncebox {args[0]}` listening on {port}")
        yield base
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def console_serves_its_login_page(venv: Venv, _request: pytest.FixtureRequest) -> None:
    with serving(venv, "console", "--db", DEMO_DB) as base:
        status, page = get(f"{base}/login")
        assert status == 200 and "<form" in page, (status, page[:500])
        assert get(f"{base}/static/console.css")[0] == 200  # the vendored files came along


def serve_answers_with_a_key(venv: Venv, _request: pytest.FixtureRequest) -> None:
    created = venv.ok(
        "oncebox", "api-keys", "create", "installer", "--scope", "read", "--db", DEMO_DB
    )
    [token] = re.findall(r"obx_\S+", created.stdout)
    with serving(venv, "serve", "--app", "freightapp", "--db", DEMO_DB) as base:
        status, body = get(f"{base}/openapi.json", token)
        assert status == 200, (status, body[:500])
        assert "weekly_digest" in body


def metrics_are_scraped(venv: Venv) -> None:
    process = subprocess.Popen(
        [str(venv.bin / "oncebox"), "metrics", "--db", DEMO_DB, "--bind", "127.0.0.1:0"],
        cwd=venv.work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        [url] = re.findall(r"http://\S+/metrics", first) or [first]
        status, text = get(url)
        assert status == 200 and "oncebox_jobs" in text, (status, text[:500])
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)


SQLALCHEMY_ENQUEUE = """
import sqlalchemy as sa
from sqlalchemy.orm import Session
from oncebox import Box

box = Box("sqlite:///orm.db")

@box.task(key="booking/{n}")
def booked(ctx, n: int) -> None: ...

engine = sa.create_engine("sqlite:///orm.db")
with engine.begin() as connection:
    connection.execute(sa.text("CREATE TABLE bookings (id INTEGER PRIMARY KEY)"))
for n, keep in ((1, False), (2, True)):
    with Session(engine) as session:
        session.execute(sa.text(f"INSERT INTO bookings VALUES ({n})"))
        box.enqueue(booked, n=n, connection=session)
        session.commit() if keep else session.rollback()
print(sorted(n for n in (1, 2) if box.store.job_find_by_key(f"booking/{n}")))
"""


def sqlalchemy_enqueue_commits_with_the_session(
    venv: Venv, _request: pytest.FixtureRequest
) -> None:
    (venv.work / "orm.py").write_text(SQLALCHEMY_ENQUEUE)
    assert venv.ok("python", "orm.py").stdout.strip() == "[2]"  # the rolled-back one: no job


def django_project_migrates_and_works(venv: Venv, _request: pytest.FixtureRequest) -> None:
    project = venv.work / "django_bookings"
    shutil.copytree(
        ROOT / "examples" / "django_bookings",
        project,
        ignore=shutil.ignore_patterns("__pycache__", "*.db", "tests"),
    )
    env = {
        "BOOKINGS_DB": f"sqlite:///{venv.work / 'bookings.db'}",
        "ONCEBOX_EMAIL": f"file://{venv.work / 'outbox'}",
    }
    venv.ok("python", "manage.py", "migrate", "--verbosity", "0", env=env, cwd=project)
    venv.ok("python", "manage.py", "shell", "--command", ENQUEUE, env=env, cwd=project)
    worker = venv.ok("python", "manage.py", "oncebox_worker", "--until-idle", env=env, cwd=project)
    assert "1 completed" in worker.stdout, worker.stdout
    assert len(list((venv.work / "outbox").glob("*.eml"))) == 1


def tracing_uses_the_otel_api(venv: Venv, _request: pytest.FixtureRequest) -> None:
    check = "import oncebox.kernel.tracing as t; assert t.trace is not None, 'no opentelemetry'"
    venv.ok("python", "-c", check)


PUBLISH = """
import sys, uuid
from oncebox import Box
box = Box("sqlite:///brokers.db")
queue = f"install-{uuid.uuid4().hex[:12]}"
box.queue(queue, broker=sys.argv[1])

@box.task(key="parcel/{n}", queue=queue)
def parcel(ctx, n: int) -> None: ...

print(box.publish_unrecorded(parcel, n=1))
"""


def publishes_to(url: Callable[[pytest.FixtureRequest], str]) -> Check:
    """A job published to the broker `url` names, on a queue of its own."""

    def check(venv: Venv, request: pytest.FixtureRequest) -> None:
        (venv.work / "publish.py").write_text(PUBLISH)
        assert venv.ok("python", "publish.py", url(request)).stdout.strip()

    return check


def amqp(_request: pytest.FixtureRequest) -> str:
    return reachable(AMQP_URL)


def nats(_request: pytest.FixtureRequest) -> str:
    return reachable(NATS_URL)


def sqs(request: pytest.FixtureRequest) -> str:
    return sqs_url(request.getfixturevalue("sqs_endpoint"))


BROKER_APP = """
from oncebox import Box
box = Box()
box.queue("parcels", broker={url!r})

@box.task(key="parcel/{{n}}", queue="parcels")
def parcel(ctx, n: int) -> None: ...
"""
BROKERS = {
    "rabbitmq": "amqp://127.0.0.1:5672/%2F",
    "sqs": "sqs://us-east-1",
    "nats": "nats://127.0.0.1:4222",
}


def without_extras_each_command_names_its_extra(
    venv: Venv, _request: pytest.FixtureRequest
) -> None:
    metrics_are_scraped(venv)
    db = ["--db", DEMO_DB]
    venv.one_line("console", "oncebox", "console", *db)
    venv.one_line("console", "oncebox", "serve", "--app", "freightapp", *db)
    venv.one_line("console", "oncebox", "receive", "--app", "freightapp", *db)
    for extra, url in BROKERS.items():
        (venv.work / f"{extra}app.py").write_text(BROKER_APP.format(url=url))
        venv.one_line(extra, "oncebox", "worker", "--app", f"{extra}app", *db, "--until-idle")
    orm = "from oncebox import Box\nBox('sqlite:///orm.db').use_sqlalchemy()"
    done = venv.run("python", "-c", orm)
    assert "pip install 'oncebox[sqlalchemy]'" in done.stderr.strip().splitlines()[-1], done.stderr


EXTRA_CHECKS: dict[str | None, list[Check]] = {
    None: [without_extras_each_command_names_its_extra],
    "console": [console_serves_its_login_page, serve_answers_with_a_key],
    "sqlalchemy": [sqlalchemy_enqueue_commits_with_the_session],
    "fastapi": [sqlalchemy_enqueue_commits_with_the_session],
    "django": [django_project_migrates_and_works],
    "otel": [tracing_uses_the_otel_api],
    "rabbitmq": [publishes_to(amqp)],
    "sqs": [publishes_to(sqs)],
    "nats": [publishes_to(nats)],
}


def test_every_extra_has_its_check():
    assert set(EXTRA_CHECKS) == {None, *EXTRAS}


def test_an_install_runs_the_first_steps_and_its_extras_command(venv, request):
    first_steps(venv)
    for check in EXTRA_CHECKS[venv.extra]:
        check(venv, request)


# -- what the wheel and the sdist hold ------------------------------------------------------------


def package_files() -> set[str]:
    """Every file of the package in the source tree (tracked by git when this is a checkout)."""
    listed = subprocess.run(
        ["git", "ls-files", "src/oncebox"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if listed.returncode == 0 and listed.stdout.strip():
        names = listed.stdout.split()
    else:
        names = [
            str(p.relative_to(ROOT))
            for p in (ROOT / "src" / "oncebox").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        ]
    return {name.removeprefix("src/") for name in names}


def test_the_wheel_holds_every_file_of_the_package(dist):
    held = set(zipfile.ZipFile(dist.wheel).namelist())
    missing = sorted(package_files() - held)
    assert not missing, f"the wheel lacks {len(missing)} file(s): {missing[:20]}"
    kinds = {
        "SQL": "oncebox/store/sql/postgres/migrations/0001_core.sql",
        "console templates": "oncebox/console/templates/base.html",
        "vendored static files": "oncebox/console/static/htmx.min.js",
        "alert rules": "oncebox/alerts/oncebox.rules.yml",
        "the demo's templates": "oncebox/examples/logistics/templates/digest.html",
        "the type marker": "oncebox/py.typed",
    }
    assert {kind: path for kind, path in kinds.items() if path not in held} == {}
    strays = sorted(n for n in held if not n.startswith(("oncebox/", "oncebox-")))
    assert not strays, f"the wheel holds files outside the package: {strays[:20]}"


def test_the_sdist_holds_the_package_the_readme_and_the_project(dist):
    with tarfile.open(dist.sdist) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        held = {name.removeprefix(f"{top}/") for name in sdist.getnames()}
    expected = {f"src/{name}" for name in package_files()} | {"README.md", "pyproject.toml"}
    missing = sorted(expected - held)
    assert not missing, f"the sdist lacks {len(missing)} file(s): {missing[:20]}"


def test_the_wheels_metadata_says_what_pypi_shows(dist):
    with zipfile.ZipFile(dist.wheel) as wheel:
        [name] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(wheel.read(name))
    assert metadata["Name"] == "oncebox"
    assert len(metadata["Summary"] or "") > 40, metadata["Summary"]
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["Requires-Python"] == ">=3.11"
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert "## Twenty lines" in metadata.get_payload(), "the long description is the README"
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Changelog", "Issues"} <= set(urls), urls
    assert all(u.startswith("https://") for u in urls.values()), urls
    classifiers = metadata.get_all("Classifier") or []
    for needed in (
        "Development Status :: ",
        "Intended Audience :: Developers",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.11",
        "Typing :: Typed",
        "Framework :: Django",
    ):
        assert any(c.startswith(needed) for c in classifiers), (needed, classifiers)
    versions = [c.rsplit(" ", 1)[1] for c in classifiers if re.fullmatch(r".*:: 3\.\d+", c)]
    assert all(tuple(map(int, v.split("."))) >= (3, 11) for v in versions), versions
    assert set(metadata.get_all("Provides-Extra") or []) == {*EXTRAS, "dev"}

"""`oncebox console`: its usage mistakes, its users file, and a real start that prints a working
login link when no user is configured."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from oncebox.console.users import User, hash_password, verify_password
from support.console_browser import free_port
from support.waiting import wait_until
from test_cli import TESTS, assert_one_line_error, oncebox


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'console.db'}"
    assert oncebox("migrate", "--db", url).returncode == 0
    return url


@pytest.mark.parametrize("bind", ["8080", "localhost:", ":8080", "localhost:99999", "h:x"])
def test_a_bad_bind_address_is_a_usage_mistake(db, bind):
    assert_one_line_error(oncebox("console", "--db", db, "--bind", bind), 2, "HOST:PORT")


def test_a_root_path_must_start_with_a_slash_and_not_end_with_one(db):
    assert_one_line_error(oncebox("console", "--db", db, "--root-path", "ops/"), 2, "--root-path")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("olga admin scrypt$1$1$1$x$y", "operator or viewer"),
        ("olga operator not-a-hash", "scrypt$N$r$p$salt$hash"),
        ("olga operator", "expected `name role hash`"),
    ],
)
def test_a_mistake_in_the_users_file_names_its_entry(db, tmp_path, line, said):
    users = tmp_path / "users"
    users.write_text(f"# the console's users\n{line}\n")
    result = oncebox("console", "--db", db, "--users-file", str(users))
    assert_one_line_error(result, 2, f"{users}, entry 2", said)


def test_a_user_listed_twice_is_refused(db):
    hashed = hash_password("pw")
    result = oncebox(
        "console",
        "--db",
        db,
        env={"ONCEBOX_CONSOLE_USERS": f"a:viewer:{hashed};a:operator:{hashed}"},
    )
    assert_one_line_error(result, 2, "ONCEBOX_CONSOLE_USERS, entry 2", "listed twice")


def test_hash_password_prints_a_hash_that_verifies_the_password():
    result = subprocess.run(
        [sys.executable, "-m", "oncebox.cli", "console", "hash-password"],
        input="correct horse\ncorrect horse\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    hashed = result.stdout.strip().splitlines()[-1]
    assert hashed.startswith("scrypt$")
    assert verify_password(User("x", "viewer", hashed), "correct horse")
    assert not verify_password(User("x", "viewer", hashed), "correct horse!")


@contextmanager
def console_process(
    db: str, *extra: str, stderr: list[str] | None = None
) -> Iterator[tuple[str, str]]:
    """`oncebox console` in a process of its own: its base URL and the login link it printed,
    once it answers; what it writes to stderr goes to `stderr`, line by line, as it comes."""
    port = free_port()
    command = [sys.executable, "-m", "oncebox.cli", "console", "--db", db]
    with subprocess.Popen(
        [*command, "--bind", f"127.0.0.1:{port}", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    ) as process:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(process.stdout or []), daemon=True)
        reader.start()
        errors = stderr if stderr is not None else []
        error_reader = threading.Thread(
            target=lambda: errors.extend(process.stderr or []), daemon=True
        )
        error_reader.start()
        try:

            def printed_link() -> str:
                said = [x for x in lines if "log in at " in x]
                return said[0].split("log in at ")[1].strip() if said else ""

            link = wait_until(printed_link, what="the login link", timeout=60)
            base = f"http://127.0.0.1:{port}"

            def up() -> bool:
                try:
                    return httpx.get(f"{base}/", timeout=2).status_code == 303
                except httpx.TransportError:
                    return False

            wait_until(up, what="the console to answer", timeout=60)
            yield base, link
        finally:
            process.terminate()
            process.wait(30)
            reader.join(30)
            error_reader.join(30)


@pytest.mark.slow
def test_without_users_it_prints_a_login_link_that_works_and_nothing_opens_without_it(db):
    with console_process(db) as (base, link), httpx.Client(base_url=base) as web:
        assert link.startswith(f"{base}/login?token=")
        assert web.get("/jobs").status_code == 303  # to the login form
        assert web.get("/login?token=guessed").status_code == 403
        assert web.get(link).status_code == 303
        assert web.get("/jobs").status_code == 200


@pytest.mark.slow
@pytest.mark.parametrize("trusted", [False, True])
def test_a_proxys_forwarded_scheme_counts_only_from_the_addresses_it_is_told_to_trust(db, trusted):
    extra = ["--forwarded-allow-ips", "127.0.0.1"] if trusted else []
    said: list[str] = []
    with console_process(db, *extra, stderr=said) as (_base, link):
        logged_in = httpx.get(link, headers={"x-forwarded-proto": "https"})
        assert logged_in.status_code == 303
        cookie = logged_in.headers["set-cookie"]
        # trusted: the proxy said the browser spoke HTTPS, so the cookie is Secure (and links
        # are https); untrusted: the header is anyone's, and ignored
        assert ("Secure" in cookie) is trusted
        assert logged_in.headers["location"].startswith("https://" if trusted else "http://")
    # the warning comes before the answer: the process has written it by now (or never will)
    assert any("forwarded-allow-ips is not set" in line for line in said) is not trusted


@pytest.mark.slow
def test_a_request_through_a_proxy_not_trusted_is_warned_about_once_on_stderr(db):
    """Issue 44 item 3: behind a proxy without --forwarded-allow-ips every client is the
    proxy's address to the login throttle; the first forwarded request says so, once."""
    said: list[str] = []
    with console_process(db, stderr=said) as (base, _link):
        assert httpx.get(f"{base}/login").status_code == 200  # not through a proxy: nothing
        for _ in range(3):
            httpx.get(f"{base}/login", headers={"x-forwarded-for": "198.51.100.7"})
        wait_until(lambda: any("forwarded-allow-ips" in line for line in said), what="a warning")
        httpx.get(f"{base}/login", headers={"x-forwarded-for": "198.51.100.8"})
    warnings = [line for line in said if "forwarded-allow-ips" in line]
    assert warnings == [
        "oncebox: warning: requests arrive through a proxy at 127.0.0.1 (they carry "
        "x-forwarded-for) but --forwarded-allow-ips is not set: every client is seen as "
        "127.0.0.1, so what counts per address (the console's login throttle) counts them all "
        "as one; if 127.0.0.1 is your proxy, start with --forwarded-allow-ips 127.0.0.1\n"
    ], said

"""`oncebox console`: its usage mistakes, its users file, and a real start that prints a working
login link when no user is configured."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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


@dataclass
class Console:
    """`oncebox console` running: its base URL, what it printed so far, its process."""

    base: str
    lines: list[str]
    process: subprocess.Popen[str]

    def links(self) -> list[str]:
        """Every login link it printed, in order."""
        return [x.split("log in at ")[1].strip() for x in list(self.lines) if "log in at " in x]

    @property
    def link(self) -> str:
        return self.links()[0]


@contextmanager
def console_process(db: str, *extra: str, stderr: list[str] | None = None) -> Iterator[Console]:
    """`oncebox console` in a process of its own, once it printed its login link and answers;
    what it writes to stderr goes to `stderr`, line by line, as it comes."""
    port = free_port()
    command = [sys.executable, "-m", "oncebox.cli", "console", "--db", db]
    with subprocess.Popen(
        [*command, "--bind", f"127.0.0.1:{port}", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
    ) as process:
        console = Console(f"http://127.0.0.1:{port}", [], process)
        reader = threading.Thread(
            target=lambda: console.lines.extend(process.stdout or []), daemon=True
        )
        reader.start()
        errors = stderr if stderr is not None else []
        error_reader = threading.Thread(
            target=lambda: errors.extend(process.stderr or []), daemon=True
        )
        error_reader.start()
        try:
            wait_until(console.links, what="the login link", timeout=60)

            def up() -> bool:
                try:
                    return httpx.get(f"{console.base}/", timeout=2).status_code == 303
                except httpx.TransportError:
                    return False

            wait_until(up, what="the console to answer", timeout=60)
            yield console
        finally:
            process.terminate()
            process.wait(30)
            reader.join(30)
            error_reader.join(30)


def follow_login_link(
    web: httpx.Client, link: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    """What a browser does with the printed link: it opens the address; a token after `#`
    never leaves the browser, and the login page's script posts it with the form."""
    address, _, fragment = link.partition("#")
    page = web.get(address, headers=headers)
    if not fragment.startswith("token=") or page.status_code != 200:
        return page
    nonce = re.search(r'name="login_csrf" value="([^"]+)"', page.text)
    assert nonce, page.text
    parts = httpx.URL(address)
    origin = f"{parts.scheme}://{(headers or {}).get('host') or parts.netloc.decode()}"
    # the form's cookie as the browser returns it (over HTTPS to a proxy, when it is Secure)
    cookie = f"oncebox_login={page.cookies['oncebox_login']}"
    return web.post(
        address,
        data={"token": fragment.removeprefix("token="), "login_csrf": nonce.group(1)},
        headers={"origin": origin, "cookie": cookie, **(headers or {})},
    )


@pytest.mark.slow
def test_without_users_it_prints_a_login_link_that_works_and_nothing_opens_without_it(db):
    with console_process(db) as console, httpx.Client(base_url=console.base) as web:
        assert console.link.startswith(f"{console.base}/login")
        assert web.get("/jobs").status_code == 303  # to the login form
        assert follow_login_link(web, f"{console.base}/login#token=guessed").status_code == 403
        assert follow_login_link(web, console.link).status_code == 303
        assert web.get("/jobs").status_code == 200


@pytest.mark.slow
def test_the_printed_link_logs_in_once_and_its_token_stays_out_of_the_address(db):
    with console_process(db) as console:
        with httpx.Client(base_url=console.base) as first:
            assert follow_login_link(first, console.link).status_code == 303
            assert first.get("/jobs").status_code == 200
        with httpx.Client(base_url=console.base) as second:
            again = follow_login_link(second, console.link)
            assert again.status_code == 403, again.text
            assert second.get("/jobs").status_code == 303  # still to the login form
        # the token travels after `#`: no request line, access log or proxy log holds it
        address, _, fragment = console.link.partition("#")
        assert "?" not in address and fragment.startswith("token="), console.link


@pytest.mark.slow
def test_sighup_prints_a_new_link_and_the_old_one_dies(db):
    with console_process(db) as console:
        old = console.link
        console.process.send_signal(signal.SIGHUP)
        new = wait_until(lambda: console.links()[1:], what="a second login link")[0]
        assert new != old
        with httpx.Client(base_url=console.base) as web:
            assert follow_login_link(web, old).status_code == 403
            assert follow_login_link(web, new).status_code == 303
            assert web.get("/jobs").status_code == 200
        assert console.process.poll() is None  # the signal renewed the link, it did not stop it


@pytest.mark.slow
def test_a_request_naming_another_host_is_refused_in_one_line(db):
    with console_process(db) as console:
        port = console.base.rsplit(":", 1)[1]
        for path in ["/", "/login", "/static/console.css"]:
            refused = httpx.get(console.base + path, headers={"host": "evil.example:18080"})
            assert refused.status_code == 400, (path, refused.status_code, refused.text)
            assert len(refused.text.strip().splitlines()) == 1, refused.text
            assert "evil.example" in refused.text and "--public-url" in refused.text
        # the loopback names are this server's own, whichever a browser on this host uses
        for host in [f"localhost:{port}", f"127.0.0.1:{port}"]:
            assert httpx.get(console.base + "/", headers={"host": host}).status_code == 303


@pytest.mark.slow
def test_the_login_redirect_and_the_origin_check_never_follow_the_host_header(db):
    with console_process(db) as console:
        port = console.base.rsplit(":", 1)[1]
        forged = {"host": "evil.example:18080"}
        with httpx.Client(base_url=console.base) as web:
            done = follow_login_link(web, console.link, forged)
            assert "evil.example" not in done.headers.get("location", ""), done.headers
            assert done.status_code == 400, (done.status_code, done.text)
        with httpx.Client(base_url=console.base) as web:
            # a Host this server answers to: the redirect names no host at all
            done = follow_login_link(web, console.link, {"host": f"localhost:{port}"})
            assert (done.status_code, done.headers["location"]) == (303, "/")
            # a change whose Origin is a forged host's is refused, whatever Host says
            nonce = re.search(r'name="csrf" value="([^"]+)"', web.get("/dead").text)
            assert nonce
            for origin, host in [
                ("http://evil.example:18080", f"127.0.0.1:{port}"),
                ("http://evil.example:18080", "evil.example:18080"),
            ]:
                refused = web.post(
                    "/logout",
                    data={"csrf": nonce.group(1)},
                    headers={"origin": origin, "host": host},
                )
                assert refused.status_code in (400, 403), (origin, host, refused.status_code)
            assert web.get("/jobs").status_code == 200  # still logged in: nothing happened


@pytest.mark.slow
@pytest.mark.parametrize("trusted", [False, True])
def test_a_proxys_forwarded_scheme_counts_only_from_the_addresses_it_is_told_to_trust(db, trusted):
    extra = ["--forwarded-allow-ips", "127.0.0.1"] if trusted else []
    said: list[str] = []
    with (
        console_process(db, *extra, stderr=said) as console,
        httpx.Client(base_url=console.base) as web,
    ):
        logged_in = follow_login_link(web, console.link, {"x-forwarded-proto": "https"})
        assert logged_in.status_code == 303, logged_in.text
        cookie = logged_in.headers["set-cookie"]
        # trusted: the proxy said the browser spoke HTTPS, so the cookie is Secure; untrusted:
        # the header is anyone's, and ignored
        assert ("Secure" in cookie) is trusted
        assert logged_in.headers["location"] == "/"  # a path: it names no scheme nor host
    # the warning comes before the answer: the process has written it by now (or never will)
    assert any("forwarded-allow-ips is not set" in line for line in said) is not trusted


@pytest.mark.slow
def test_a_request_through_a_proxy_not_trusted_is_warned_about_once_on_stderr(db):
    """Issue 44 item 3: behind a proxy without --forwarded-allow-ips every client is the
    proxy's address to the login throttle; the first forwarded request says so, once."""
    said: list[str] = []
    with console_process(db, stderr=said) as console:
        base = console.base
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

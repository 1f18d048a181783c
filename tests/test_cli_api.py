"""`oncebox api-keys` and `oncebox serve`, as a user runs them: a key's secret shown once and
never stored or listed, mistakes as one line and exit 2, and a real server whose API and console
answer side by side."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from oncebox.api.keys import authenticate, digest
from oncebox.store import open_store
from support.console_browser import free_port
from support.reports import SECRET, SECRET_ENV, signed
from support.waiting import wait_until
from test_cli import CODE, TESTS, assert_one_line_error, oncebox


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'api.db'}"
    assert oncebox("migrate", "--db", url).returncode == 0
    return url


def test_a_key_is_shown_once_stored_as_its_digest_and_listed_without_it(db):
    made = oncebox(
        "api-keys",
        "create",
        "billing",
        "--scope",
        "enqueue",
        "--scope",
        "read",
        "--rate",
        "10/s",
        "--db",
        db,
        "--actor",
        "olga",
    )
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    assert token.startswith("obx_") and "shown once" in made.stderr
    store = open_store(db)
    try:
        row = store.api_key_list()[0]
        assert (row.name, row.scopes, row.rate, row.created_by) == (
            "billing",
            "enqueue read",
            "10/s",
            "olga",
        )
        assert row.secret_sha256 == digest(token.split("_", 2)[2])
        assert token.split("_", 2)[2] not in Path(db.removeprefix("sqlite:///")).read_text(
            errors="replace"
        )
        key = authenticate(store, f"Bearer {token}")
        assert key is not None and key.may("enqueue") and not key.may("operate")
    finally:
        store.close()
    listed = oncebox("api-keys", "list", "--db", db, "--json")
    shapes = json.loads(listed.stdout)
    assert [k["name"] for k in shapes] == ["billing"] and "token" not in shapes[0]
    assert (
        token not in listed.stdout and token not in oncebox("api-keys", "list", "--db", db).stdout
    )
    revoked = oncebox("api-keys", "revoke", "billing", "--db", db)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    store = open_store(db)
    try:
        assert authenticate(store, f"Bearer {token}") is None
    finally:
        store.close()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["create", "Billing", "--scope", "read"], "must be 1-64 of a-z"),
        (["create", "b", "--scope", "read", "--rate", "lots"], "COUNT/PERIOD"),
        (["create", "b", "--scope", "admin"], "'admin' is not one of"),
        (["create", "b"], "Missing option '--scope'"),
        (["revoke", "nobody"], "no API key named 'nobody'"),
    ],
)
def test_api_key_mistakes_are_one_line_and_exit_2(db, args, said):
    assert_one_line_error(oncebox("api-keys", *args, "--db", db), 2, said)


def test_a_key_name_is_taken_for_good(db):
    assert oncebox("api-keys", "create", "ci", "--scope", "read", "--db", db).returncode == 0
    assert oncebox("api-keys", "revoke", "ci", "--db", db).returncode == 0
    again = oncebox("api-keys", "create", "ci", "--scope", "read", "--db", db)
    assert_one_line_error(again, 2, "an API key named 'ci' exists")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([], "--app MODULE is required"),
        (["--app", "support.cli_freight", "--bind", "8080"], "HOST:PORT"),
        (["--app", "support.cli_freight", "--root-path", "api/"], "--root-path"),
        (["--app", "support.cli_freight", "--users-file", "users"], "add --console"),
    ],
)
def test_serve_mistakes_are_one_line_and_exit_2(db, args, said):
    assert_one_line_error(oncebox("serve", "--db", db, *args), 2, said)


@contextmanager
def served(args: list[str], env: dict[str, str], probe: str, method: str = "GET"):
    """`oncebox ARGS` serving on a free port until the block ends, once `probe` answers 401:
    its base URL, and (after the block) what it printed."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    said: list[str] = []
    full_env = {"PYTHONPATH": f"{TESTS}:{CODE}", "PATH": "/usr/bin:/bin", **env}
    with subprocess.Popen(
        [sys.executable, "-m", "oncebox.cli", *args, "--bind", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    ) as process:
        reader = threading.Thread(target=lambda: said.extend(process.stdout or []), daemon=True)
        reader.start()
        try:

            def up() -> bool:
                try:
                    return httpx.request(method, base + probe, timeout=2).status_code == 401
                except httpx.TransportError:
                    return False

            wait_until(up, what=f"oncebox {args[0]} to answer", timeout=60)
            yield base, said
        finally:
            process.terminate()
            process.wait(30)
            reader.join(30)


def test_serve_answers_the_api_and_the_console_side_by_side(db, tmp_path):
    made = oncebox("api-keys", "create", "ci", "--scope", "read", "--db", db)
    token = made.stdout.strip().splitlines()[-1]
    env = {"ONCEBOX_DB": db, "ONCEBOX_EMAIL": f"file://{tmp_path / 'sent'}"}
    args = ["serve", "--app", "support.cli_freight", "--console"]
    with served(args, env, "/openapi.json") as (base, said):
        auth = {"Authorization": f"Bearer {token}"}
        document = httpx.get(f"{base}/openapi.json", headers=auth, timeout=10).json()
        assert "/v1/tasks/weekly_digest/jobs" in document["paths"]
        assert httpx.get(f"{base}/v1/periods", headers=auth, timeout=10).status_code == 200
        login = httpx.get(f"{base}/console/login", timeout=10)
        assert login.status_code == 200 and "oncebox" in login.text
        assert httpx.get(f"{base}/console/", timeout=10).status_code == 303  # a login first
    text = "".join(said)
    assert "oncebox API for" in text and f"{base}/console/login#token=" in text


@pytest.mark.slow
def test_serve_refuses_other_hosts_and_scopes_the_consoles_cookie_to_its_path(db, tmp_path):
    env = {"ONCEBOX_DB": db, "ONCEBOX_EMAIL": f"file://{tmp_path / 'sent'}"}
    public = "https://ops.example"
    args = ["serve", "--app", "support.cli_freight", "--console", "--public-url", public]
    with served(args, env, "/openapi.json") as (base, said):
        forged = {"host": "evil.example:18080"}
        for path in ["/openapi.json", "/v1/periods", "/console/login", "/console/"]:
            refused = httpx.get(base + path, headers=forged, timeout=10)
            assert refused.status_code == 400, (path, refused.status_code, refused.text)
            assert len(refused.text.strip().splitlines()) == 1, refused.text
        # the public URL's host is served (the proxy passes it through), and so is the bind's
        proxied = {"host": "ops.example", "origin": public}
        assert httpx.get(base + "/openapi.json", headers=proxied, timeout=10).status_code == 401
        [line] = [x for x in said if "log in at " in x]
        link = line.split("log in at ")[1].strip()
        assert link.startswith(f"{public}/console/login#token="), link
        with httpx.Client(base_url=base, timeout=10) as web:
            page = web.get("/console/login", headers=proxied)
            nonce = re.search(r'name="login_csrf" value="([^"]+)"', page.text)
            assert nonce, page.text
            token = link.partition("#token=")[2]
            # the form's Secure cookie, as a browser speaking HTTPS to the proxy returns it
            cookie = f"oncebox_login={page.cookies['oncebox_login']}"
            done = web.post(
                "/console/login",
                data={"token": token, "login_csrf": nonce.group(1)},
                headers={**proxied, "cookie": cookie},
            )
        assert (done.status_code, done.headers["location"]) == (303, "/console/"), done.text
        [cookie] = [
            c for c in done.headers.get_list("set-cookie") if c.startswith("oncebox_session=")
        ]
        attributes = {a.strip().split("=")[0].lower(): a.strip() for a in cookie.split(";")[1:]}
        assert attributes["path"] == "Path=/console", cookie
        assert attributes["samesite"].lower() in ("samesite=strict", "samesite=lax"), cookie
        assert "httponly" in attributes and "secure" in attributes, cookie  # the URL is https


@pytest.mark.parametrize(
    ("app", "secret", "said"),
    [
        ("support.cli_freight", True, "no channel takes provider reports"),
        ("support.reports_app", False, "ONCEBOX_TEST_REPORTS_SECRET, which is not set"),
    ],
)
def test_receive_mistakes_are_one_line_and_exit_2(db, monkeypatch, app, secret, said):
    if secret:
        monkeypatch.setenv(SECRET_ENV, SECRET)
    else:
        monkeypatch.delenv(SECRET_ENV, raising=False)
    assert_one_line_error(oncebox("receive", "--db", db, "--app", app), 2, said)


@pytest.mark.parametrize("command", ["receive", "serve"])
def test_the_receiver_answers_alone_or_beside_the_api(db, command):
    prefix = "" if command == "receive" else "/deliveries"
    env = {"ONCEBOX_DB": db, SECRET_ENV: SECRET}
    args = [command, "--app", "support.reports_app"]
    with served(args, env, f"{prefix}/email", "POST") as (base, said):
        url = f"{base}{prefix}/email"
        body, headers = signed({"type": "email.delivered", "data": {"email_id": "re_1"}})
        answer = httpx.post(url, content=body, headers=headers, timeout=10)
        assert answer.status_code == 200 and answer.json()["outcome"] == "unmatched"
    assert f"provider reports for channel 'email': POST {url}" in "".join(said)

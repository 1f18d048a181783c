"""The console knows its public URL and trusts no Host header: a request naming another host is
refused, redirects and links are paths, a change counts only from the public URL's origins, and
its cookies are its root path's alone. The login token of a console without users works once,
for fifteen minutes (on a clock the test moves), and never travels in an address."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from oncebox import Box
from oncebox.console import ConsoleSettings, create_app
from oncebox.console.login_token import TOKEN_TTL_S, LoginToken, login_link
from oncebox.console.users import hash_password, parse_users
from oncebox.kernel.public_url import PublicUrl, for_server
from support.console_browser import free_port
from support.waiting import wait_until

BIND = "http://127.0.0.1:8080"
PUBLIC = for_server(None, "127.0.0.1", 8080, "")
PROXIED = for_server("https://ops.example", "127.0.0.1", 8080, "")
PASSWORD = "operator-password"
USERS = parse_users(f"olga operator {hash_password(PASSWORD)}", "test users")
FORGED = "evil.example:18080"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    made = Box(f"sqlite:///{tmp_path_factory.mktemp('origin') / 'console.db'}")
    yield made
    made.close()


def console(box: Box, public: PublicUrl | None = PUBLIC, *, users: Any = USERS) -> Any:
    return create_app(box, ConsoleSettings(users=users, public_url=public))


def client(app: Any, base_url: str = BIND, **kwargs: Any) -> TestClient:
    return TestClient(app, base_url=base_url, follow_redirects=False, **kwargs)


def login_nonce(web: TestClient, prefix: str = "", **kwargs: Any) -> str:
    page = web.get(f"{prefix}/login", **kwargs)
    found = re.search(r'name="login_csrf" value="([^"]+)"', page.text)
    assert found, (page.status_code, page.text)
    return found.group(1)


def password_login(web: TestClient, headers: dict[str, str], prefix: str = "") -> Any:
    nonce = login_nonce(web, prefix, headers=headers)
    return web.post(
        f"{prefix}/login",
        data={"name": "olga", "password": PASSWORD, "login_csrf": nonce},
        headers=headers,
    )


def token_login(web: TestClient, token: str) -> Any:
    nonce = login_nonce(web)
    return web.post("/login", data={"token": token, "login_csrf": nonce}, headers={"origin": BIND})


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/"), ("GET", "/login"), ("GET", "/static/console.css"), ("POST", "/login")],
)
def test_a_request_naming_another_host_is_refused_in_one_line(box, method, path):
    web = client(console(box))
    refused = web.request(method, path, headers={"host": FORGED, "origin": f"http://{FORGED}"})
    assert refused.status_code == 400, (refused.status_code, refused.text)
    assert refused.headers["content-type"].startswith("text/plain")
    assert len(refused.text.strip().splitlines()) == 1, refused.text
    assert FORGED in refused.text and "--public-url" in refused.text


def test_the_bind_address_and_the_loopback_names_are_its_own(box):
    web = client(console(box))
    for host in ["127.0.0.1:8080", "localhost:8080", "[::1]:8080", "LOCALHOST:8080"]:
        assert web.get("/", headers={"host": host}).status_code == 303, host
    for host in ["10.0.0.5:8080", "127.0.0.1.evil.example", "localhost.evil.example"]:
        assert web.get("/", headers={"host": host}).status_code == 400, host


def test_on_every_address_without_a_public_url_only_loopback_is_answered(box):
    web = client(console(box, for_server(None, "0.0.0.0", 8080, "")))  # noqa: S104
    assert web.get("/", headers={"host": "localhost:8080"}).status_code == 303
    assert web.get("/", headers={"host": "10.0.0.5:8080"}).status_code == 400
    given = client(console(box, for_server("http://ops.internal:8080", "0.0.0.0", 8080, "")))  # noqa: S104
    assert given.get("/", headers={"host": "ops.internal:8080"}).status_code == 303
    assert given.get("/", headers={"host": "10.0.0.5:8080"}).status_code == 400


def test_the_login_redirect_and_every_link_are_paths_naming_no_host(box):
    web = client(console(box))
    done = password_login(web, {"host": "localhost:8080", "origin": "http://localhost:8080"})
    assert (done.status_code, done.headers["location"]) == (303, "/")
    page = web.get("/", headers={"host": "localhost:8080"}).text
    links = re.findall(r'(?:href|action|src|hx-get|data-src)="([^"]*)"', page)
    assert links and all(link.startswith("/") and not link.startswith("//") for link in links), [
        link for link in links if not link.startswith("/")
    ]
    # an app mounted without a public URL (its host checked by the app around it) too
    bare = client(console(box, None), base_url=f"http://{FORGED}")
    assert bare.get("/").headers["location"] == "/login"


def test_a_change_counts_only_from_the_public_urls_origin(box):
    app = console(box, PROXIED)
    # the browser speaks HTTPS to the proxy (its cookies are Secure), the proxy HTTP to the app

    def client(app: Any) -> TestClient:
        return TestClient(app, base_url="https://ops.example", follow_redirects=False)

    proxied = {"host": "ops.example", "origin": "https://ops.example"}
    for headers in [
        {"host": "ops.example", "origin": f"http://{FORGED}"},  # a page elsewhere posting here
        {"host": "ops.example", "origin": "http://ops.example"},  # not the scheme it is served on
        {"host": "ops.example", "referer": f"http://{FORGED}/login"},  # no Origin: the Referer's
        {"host": "ops.example"},  # neither
    ]:
        refused = password_login(client(app), headers)
        assert refused.status_code == 403, (headers, refused.status_code, refused.text)
    forged = client(app).post("/login", data={"name": "olga"}, headers={**proxied, "host": FORGED})
    assert forged.status_code == 400
    assert password_login(client(app), proxied).status_code == 303
    # a proxy that sends the bind address as Host: the browser's Origin is what counts
    rewritten = {"host": "127.0.0.1:8080", "origin": "https://ops.example"}
    assert password_login(client(app), rewritten).status_code == 303
    referer = {"host": "ops.example", "referer": "https://ops.example/login"}
    assert password_login(client(app), referer).status_code == 303


@pytest.mark.parametrize(
    "public_url", ["http://ops.example/console", "https://ops.example/console"]
)
def test_its_cookies_are_its_root_paths_alone_http_only_and_strict(box, public_url):
    public = for_server(public_url, "127.0.0.1", 8080, "")
    # mounted under /console, as `oncebox serve --console` serves it beside the API
    mounted = Starlette(routes=[Mount("/console", console(box, public))])
    web = client(mounted, public.origin)
    headers = {"host": "ops.example", "origin": public.origin}
    done = password_login(web, headers, "/console")
    assert done.status_code == 303 and done.headers["location"] == "/console/"
    cookies = [v for k, v in done.headers.multi_items() if k == "set-cookie"]
    session = next(c for c in cookies if c.startswith("oncebox_session="))
    attributes = {a.strip().split("=")[0].lower(): a.strip() for a in session.split(";")[1:]}
    assert attributes["path"] == "Path=/console", session
    assert "httponly" in attributes and attributes["samesite"].lower() == "samesite=strict"
    assert ("secure" in attributes) is public_url.startswith("https:"), session
    form = client(mounted, public.origin).get("/console/login").headers["set-cookie"]
    assert "Path=/console;" in form and ("Secure" in form) is public_url.startswith("https:")


def test_the_login_token_logs_in_once(box):
    app = console(box, users={})
    token = app.state.login_token.renew()
    first = client(app)
    assert token_login(first, token).status_code == 303
    assert first.get("/").status_code == 200
    second = client(app)
    again = token_login(second, token)
    assert again.status_code == 403 and "works once" in again.text
    assert second.get("/").status_code == 303  # to the login form


def test_an_expired_login_token_is_refused(box):
    app = console(box, users={})
    clock = Clock()
    app.state.login_token = LoginToken(clock=clock)
    token = app.state.login_token.renew()
    clock.now += TOKEN_TTL_S - 1
    assert token_login(client(app), token).status_code == 303  # within its fifteen minutes
    token = app.state.login_token.renew()
    clock.now += TOKEN_TTL_S
    web = client(app)
    assert token_login(web, token).status_code == 403
    assert web.get("/").status_code == 303


def test_a_new_token_kills_the_one_before(box):
    app = console(box, users={})
    old = app.state.login_token.renew()
    new = app.state.login_token.renew()
    assert token_login(client(app), old).status_code == 403
    assert token_login(client(app), new).status_code == 303


def test_a_token_in_the_address_is_refused_and_spent(box):
    app = console(box, users={})
    token = app.state.login_token.renew()
    web = client(app)
    shown = web.get(f"/login?token={token}")
    assert shown.status_code == 400 and "#token=" in shown.text
    assert web.get("/").status_code == 303
    assert token_login(web, token).status_code == 403  # it is in an access log now


def test_concurrent_uses_of_one_token_log_in_once():
    login_token = LoginToken()
    token = login_token.renew()
    start = threading.Barrier(16)
    won: list[bool] = []

    def use() -> None:
        start.wait(10)
        won.append(login_token.exchange(token))

    threads = [threading.Thread(target=use) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert sorted(won) == [False] * 15 + [True]


def test_the_login_page_posts_the_links_token_with_a_script_the_csp_allows(box):
    app = console(box, users={})
    page = client(app).get("/login")
    assert 'name="token"' in page.text and 'id="token-login"' in page.text
    [script] = re.findall(r'<script src="(/static/login\.js)" defer></script>', page.text)
    assert "script-src 'self'" in page.headers["content-security-policy"]
    code = client(app).get(script).text
    assert "location.hash" in code and "replaceState" in code and "token-login" in code
    with_users = client(console(box)).get("/login").text
    assert "login.js" not in with_users and 'name="token"' not in with_users


def test_the_login_token_never_reaches_the_access_log(box, caplog):
    """Served for real, with uvicorn's access log on: the link as printed, followed as a browser
    does (the part after `#` stays in the browser; the page's script posts it)."""
    port = free_port()
    public = for_server(None, "127.0.0.1", port, "")
    app = console(box, public, users={})
    link = login_link(public.base, app.state.login_token.renew())
    token = link.partition("#token=")[2]
    caplog.set_level(logging.INFO, logger="uvicorn.access")
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_config=None, log_level="info", access_log=True
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="console", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, what="the console to listen")
        with httpx.Client(timeout=10) as browser:
            address = link.partition("#")[0]
            page = browser.get(address)
            nonce = re.search(r'name="login_csrf" value="([^"]+)"', page.text)
            assert nonce, page.text
            done = browser.post(
                address,
                data={"token": token, "login_csrf": nonce.group(1)},
                headers={"origin": public.origin},
            )
            assert done.status_code == 303, done.text
            assert browser.get(f"{public.base}/jobs").status_code == 200
    finally:
        server.should_exit = True
        thread.join(30)
    lines = [r.getMessage() for r in caplog.records if r.name == "uvicorn.access"]
    assert any('"GET /login' in x for x in lines) and any('"POST /login' in x for x in lines)
    assert not [x for x in lines if token in x], lines


@pytest.mark.parametrize("offered", ["é" * 32, "\ud800", "\udcff token", "\x00"])
def test_any_text_offered_as_the_login_token_is_refused_not_raised(offered):
    """A form may carry any text (fuzzing found a non-ASCII form token raising in
    `hmac.compare_digest`): the token is compared as bytes, and the live one stays live."""
    from oncebox.console.guard import same_token

    token = LoginToken()
    assert token.exchange(offered) is False
    assert same_token(offered, "expected") is False


def test_a_link_opened_while_logged_in_is_spent_not_left_live_in_the_address(box):
    """A browser already logged in that opens a new link: a redirect to the overview would
    carry `#token=` along, live for fifteen minutes and in the history (found by review); the
    login page is shown instead, and its script spends the token."""
    app = console(box, users={})
    web = client(app)
    assert token_login(web, app.state.login_token.renew()).status_code == 303
    token = app.state.login_token.renew()
    page = web.get("/login")  # what the browser fetches for /login#token=…
    assert page.status_code == 200 and "login.js" in page.text
    assert token_login(web, token).status_code == 303  # the script posts it: spent
    assert token_login(client(app), token).status_code == 403

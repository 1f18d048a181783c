"""Logging in and out. With users configured, a name and password, throttled (`throttle.py`)
and every refusal audited with its address (`refusals.py`); with none, the one-time token of the
link printed at start (`/login#token=…`, posted by the login page's script:
`console.login_token`)."""

from __future__ import annotations

import secrets

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from oncebox.console.guard import (
    LOGIN_COOKIE,
    clear_session_cookie,
    cookie_path,
    cookie_secure,
    current_session,
    path_for,
    same_origin,
    same_token,
    sessions_of,
    set_session_cookie,
)
from oncebox.console.login_token import LoginToken
from oncebox.console.refusals import RefusedLogins, Why
from oncebox.console.render import render
from oncebox.console.throttle import UNKNOWN, LoginThrottle
from oncebox.console.users import MAX_NAME_CHARS, verify_password
from oncebox.kernel.client_address import address_key

TOKEN_USER = "token"  # noqa: S105 (a user name: the actor after a token login)
LINK_REFUSED = (
    "That login token is not valid: a token works once, within {minutes} minutes of being "
    "printed. `kill -HUP` on the console's process prints a new link on its terminal."
)
LINK_IN_ADDRESS = (
    "A login token in the address is refused, and spent (addresses are logged): use the link "
    "as printed, with #token=, or paste the token below. `kill -HUP` on the console's process "
    "prints a new link."
)


def _login_form(
    request: Request, error: str | None = None, status_code: int = 200, retry_after: int = 0
) -> Response:
    nonce = secrets.token_urlsafe(24)
    response = render(
        request,
        None,
        "login.html",
        status_code,
        login_csrf=nonce,
        error=error,
        token_login=not request.app.state.users,
    )
    if retry_after:
        response.headers["Retry-After"] = str(retry_after)
    response.set_cookie(
        LOGIN_COOKIE,
        nonce,
        httponly=True,
        samesite="strict",
        secure=cookie_secure(request),
        path=cookie_path(request),
        max_age=600,
    )
    return response


def _logged_in(request: Request, user: str, role: str) -> Response:
    sessions = sessions_of(request)
    sessions.end(request.cookies.get("oncebox_session"))  # never keep a session id across login
    session = sessions.start(user, "operator" if role == "operator" else "viewer")
    response = RedirectResponse(path_for(request, "overview"), status_code=303)
    set_session_cookie(request, response, session.id)
    response.delete_cookie(LOGIN_COOKIE, path=cookie_path(request))
    return response


def _login_token(request: Request) -> LoginToken | None:
    token: LoginToken | None = request.app.state.login_token
    return token


async def login_page(request: Request) -> Response:
    in_address = request.query_params.get("token")
    login_token = _login_token(request)
    if in_address is not None and login_token is not None:
        login_token.exchange(in_address)  # in an access log now: a live token is spent unused
        return _login_form(request, LINK_IN_ADDRESS, 400)
    if current_session(request) is not None and login_token is None:
        return RedirectResponse(path_for(request, "overview"), status_code=303)
    # with a token to log in by, the page is shown even to a session: a redirect would carry
    # the link's `#token=` to the next address, live and in the history; the page spends it
    return _login_form(request)


def _token_login(request: Request, offered: object) -> Response:
    login_token = _login_token(request)
    if isinstance(offered, str) and login_token is not None and login_token.exchange(offered):
        return _logged_in(request, TOKEN_USER, "operator")
    minutes = round(login_token.ttl_s / 60) if login_token is not None else 15
    return _login_form(request, LINK_REFUSED.format(minutes=minutes), 403)


async def login_submit(request: Request) -> Response:
    if not same_origin(request):
        return PlainTextResponse("refused: not from this console's origin", status_code=403)
    form = await request.form()
    nonce = form.get("login_csrf")
    cookie = request.cookies.get(LOGIN_COOKIE)
    if not isinstance(nonce, str) or not cookie or not same_token(nonce, cookie):
        return _login_form(request, "The login form expired; please try again.", 400)
    users = request.app.state.users
    if not users:
        return _token_login(request, form.get("token"))
    name, password = form.get("name"), form.get("password")
    if not isinstance(name, str) or not isinstance(password, str) or not name or not password:
        return _login_form(request, "Give a name and a password.", 400)
    address = request.client.host if request.client else "?"
    throttle: LoginThrottle = request.app.state.throttle
    refusals: RefusedLogins = request.app.state.refusals
    too_long = len(name) > MAX_NAME_CHARS  # no user has such a name: nothing of it is kept
    user = None if too_long else users.get(name)
    # the throttle counts a failure before the (slow) verification: concurrent guesses see it
    verdict = throttle.attempt(user.name if user else UNKNOWN, address_key(address))
    if not verdict.allowed:
        if verdict.audited:  # else counted in this (name, address)'s entry of the window
            await run_in_threadpool(refusals.record, verdict, address, name, "throttled")
        wait = verdict.wait_s
        return _login_form(
            request, f"Too many failed logins; try again in {wait} s.", 429, retry_after=wait
        )
    if too_long:
        await run_in_threadpool(refusals.record, verdict, address, name, "name-too-long")
        return _login_form(request, f"A user name is at most {MAX_NAME_CHARS} characters.", 401)
    if not await run_in_threadpool(verify_password, user, password):
        why: Why = "wrong-password" if user else "unknown-name"
        await run_in_threadpool(refusals.record, verdict, address, name, why)
        return _login_form(request, "Wrong name or password.", 401)
    assert user is not None
    throttle.succeeded(verdict)
    return _logged_in(request, user.name, user.role)


async def logout(request: Request) -> Response:
    if not same_origin(request):
        return PlainTextResponse("refused: not from this console's origin", status_code=403)
    session = current_session(request)
    form = await request.form()
    token = form.get("csrf")
    if session is not None:
        if not isinstance(token, str) or not same_token(token, session.csrf):
            return PlainTextResponse("refused: missing or wrong CSRF token", status_code=403)
        sessions_of(request).end(session.id)
    response = RedirectResponse(path_for(request, "login"), status_code=303)
    clear_session_cookie(request, response)
    return response

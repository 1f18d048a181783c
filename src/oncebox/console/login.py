"""Logging in and out. With users configured, a name and password (throttled per name and per
client address); with none, the token printed at start (`/login?token=...`)."""

from __future__ import annotations

import hmac
import secrets

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from oncebox.console.guard import (
    LOGIN_COOKIE,
    clear_session_cookie,
    current_session,
    same_origin,
    same_token,
    sessions_of,
    set_session_cookie,
)
from oncebox.console.render import render
from oncebox.console.users import verify_password

TOKEN_USER = "token"  # noqa: S105 (a user name: the actor after a token login)


def _login_form(request: Request, error: str | None = None, status_code: int = 200) -> Response:
    nonce = secrets.token_urlsafe(24)
    response = render(request, None, "login.html", status_code, login_csrf=nonce, error=error)
    response.set_cookie(
        LOGIN_COOKIE,
        nonce,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=(request.scope.get("root_path") or "") + "/",
        max_age=600,
    )
    return response


def _logged_in(request: Request, user: str, role: str) -> Response:
    sessions = sessions_of(request)
    sessions.end(request.cookies.get("oncebox_session"))  # never keep a session id across login
    session = sessions.start(user, "operator" if role == "operator" else "viewer")
    response = RedirectResponse(request.url_for("overview"), status_code=303)
    set_session_cookie(request, response, session.id)
    response.delete_cookie(LOGIN_COOKIE, path=(request.scope.get("root_path") or "") + "/")
    return response


async def login_page(request: Request) -> Response:
    token = request.query_params.get("token")
    expected = request.app.state.token
    if token is not None and expected is not None:
        if hmac.compare_digest(token.encode(), expected.encode()):
            return _logged_in(request, TOKEN_USER, "operator")
        return _login_form(
            request,
            "That login link is not valid (the console prints a new one each time it starts).",
            403,
        )
    if current_session(request) is not None:
        return RedirectResponse(request.url_for("overview"), status_code=303)
    return _login_form(request)


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
        return _login_form(
            request,
            "No users are configured: log in with the link the console printed when it started.",
            400,
        )
    name, password = form.get("name"), form.get("password")
    if not isinstance(name, str) or not isinstance(password, str) or not name or not password:
        return _login_form(request, "Give a name and a password.", 400)
    address = f"address:{request.client.host if request.client else '?'}"
    throttle = request.app.state.throttle
    wait = throttle.retry_after(f"user:{name}", address)
    if wait > 0:
        return _login_form(request, f"Too many failed logins; try again in {int(wait) + 1} s.", 429)
    user = users.get(name)
    if not await run_in_threadpool(verify_password, user, password):
        throttle.failed(f"user:{name}", address)
        return _login_form(request, "Wrong name or password.", 401)
    throttle.succeeded(f"user:{name}")
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
    response = RedirectResponse(request.url_for("login"), status_code=303)
    clear_session_cookie(request, response)
    return response

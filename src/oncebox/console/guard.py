"""Deny by default: the headers every response carries, the session every page needs, and the
checks every change passes (operator role, CSRF token, same origin, one-time action id).

Nothing is derived from the `Host` header, which is the client's to write: redirects are paths,
and a change counts as this console's own when its `Origin` is one of the public URL's origins
(`oncebox.kernel.public_url`; the CLI always gives one, and refuses requests naming another host).

Everything the console shows is user-controlled text — keys, arguments, errors, provider replies —
and is escaped by the templates (autoescape); the Content-Security-Policy allows no inline script
or style at all, so an escaping slip still cannot run anything.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oncebox.console.sessions import Session, Sessions
from oncebox.kernel.public_url import PublicUrl

SESSION_COOKIE = "oncebox_session"
LOGIN_COOKIE = "oncebox_login"  # the login form's own CSRF token (no session exists yet)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]

Handler = Callable[[Request], Awaitable[Response]]
# pages and actions are plain functions: the store is synchronous, so they run in a thread
PageFn = Callable[[Request, Session], Response]
ActionFn = Callable[[Request, Session, Any], Response]


class SecurityHeaders:
    """Adds HEADERS to every HTTP response (static files included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name for name, _ in message.get("headers", [])}
                message["headers"] = list(message.get("headers", [])) + [
                    (name, value) for name, value in HEADERS if name not in present
                ]
            await send(message)

        await self.app(scope, receive, with_headers)


def same_token(offered: str, expected: str) -> bool:
    """Whether a submitted token is the expected one, in constant time. As bytes: a form may
    carry any text, and `hmac.compare_digest` raises on two strings that are not ASCII."""
    encoding = ("utf-8", "surrogatepass")
    return hmac.compare_digest(offered.encode(*encoding), expected.encode(*encoding))


def sessions_of(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.sessions
    return sessions


def current_session(request: Request) -> Session | None:
    return sessions_of(request).get(request.cookies.get(SESSION_COOKIE))


def public_url_of(request: Request) -> PublicUrl | None:
    public: PublicUrl | None = request.app.state.settings.public_url
    return public


def cookie_path(request: Request) -> str:
    """The console's own path (its root path, `/` at the root): its cookies go nowhere else on
    the host — not to an API or an app served beside it."""
    return request.scope.get("root_path") or "/"


def cookie_secure(request: Request) -> bool:
    """Over HTTPS — the public URL's scheme, or a trusted proxy's word for this request."""
    public = public_url_of(request)
    return request.url.scheme == "https" or (public is not None and public.secure)


def set_session_cookie(request: Request, response: Response, session_id: str) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        session_id,
        httponly=True,
        samesite="strict",
        secure=cookie_secure(request),
        path=cookie_path(request),
    )


def clear_session_cookie(request: Request, response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path=cookie_path(request))


def path_for(request: Request, name: str, **params: Any) -> str:
    """The path of the console's route `name`, root path included, with no scheme or host: a
    link or redirect that cannot name another server, whatever the request's `Host` said."""
    return request.url_for(name, **params).path


def page(handler: PageFn) -> Handler:
    """A page: a live session is required, any role; otherwise to the login form."""

    async def guarded(request: Request) -> Response:
        session = current_session(request)
        if session is None:
            return RedirectResponse(path_for(request, "login"), status_code=303)
        request.state.session = session
        return await run_in_threadpool(handler, request, session)

    return guarded


def _origin_of(url: str) -> str:
    """A URL's origin; none ("") for a header no URL parser reads (`http://[`): anyone may send
    one, and it is no origin of ours."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    return f"{parts.scheme}://{parts.netloc}"


def _own_origin(request: Request, claimed: str) -> bool:
    """`claimed` is one of the public URL's origins; without a public URL (the console mounted
    in an app that checks `Host` itself), the request's own origin."""
    public = public_url_of(request)
    if public is not None:
        return public.accepts_origin(claimed)
    own = f"{request.url.scheme}://{request.url.netloc}"
    return hmac.compare_digest(claimed.encode(), own.encode())


def same_origin(request: Request) -> bool:
    """The request's Origin (or, lacking it, its Referer's origin) is this console's own. A
    POST with neither is refused: browsers send Origin with every POST they make."""
    claimed = request.headers.get("origin")
    if claimed is None or claimed == "null":
        referer = request.headers.get("referer")
        if not referer:
            return False
        claimed = _origin_of(referer)
    return _own_origin(request, claimed)


def _back_path(request: Request) -> str:
    """Where the page the action was sent from is, as a path: the Referer's path when it is
    one of this console's pages, else the overview's."""
    referer = request.headers.get("referer")
    if referer and _own_origin(request, _origin_of(referer)):
        parts = urlsplit(referer)
        root = request.scope.get("root_path") or ""
        if parts.path.startswith(root + "/") and not parts.path.startswith("//"):
            return parts.path + (f"?{parts.query}" if parts.query else "")
    return path_for(request, "overview")


def action(handler: ActionFn) -> Handler:
    """A change: POST from this origin, by a live operator session, with the session's CSRF
    token and a one-time action id. An action id already used answers with its first result
    (a double submit acts once). The handler gets the parsed form and returns a redirect."""

    async def guarded(request: Request) -> Response:
        if not same_origin(request):
            return PlainTextResponse("refused: not from this console's origin", status_code=403)
        session = current_session(request)
        if session is None:
            return PlainTextResponse("refused: not logged in", status_code=401)
        form = await request.form()
        token = form.get("csrf")
        if not isinstance(token, str) or not same_token(token, session.csrf):
            return PlainTextResponse("refused: missing or wrong CSRF token", status_code=403)
        if not session.may_act:
            return PlainTextResponse(
                f"refused: {session.user} may look but not act (role viewer)", status_code=403
            )
        action_id = form.get("action_id")
        if not isinstance(action_id, str) or not 16 <= len(action_id) <= 64:
            return PlainTextResponse("refused: the form has no action id", status_code=400)
        sessions = sessions_of(request)
        first = sessions.claim_action(session, action_id, _back_path(request))
        if first is not None:  # taken before (or being taken now): its result, not a second go
            sessions.notify(session, "info", "That action was already taken; shown once.")
            return RedirectResponse(first, status_code=303)
        request.state.session = session
        response = await run_in_threadpool(handler, request, session, form)
        location = response.headers.get("location")
        if location is not None:
            sessions.remember(session, action_id, location)
        return response

    return guarded

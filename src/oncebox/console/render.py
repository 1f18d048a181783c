"""Pages from templates: autoescaped, with what every page needs (who is logged in, the CSRF
token, a fresh one-time id for each action form, the notices left by the last action)."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from oncebox.console.guard import path_for, sessions_of
from oncebox.console.sessions import Session
from oncebox.kernel.inert import printable
from oncebox.retention.held import KIND_LABELS, kept
from oncebox.shapes import limits_shown


def _when(value: datetime | None) -> str:
    return "—" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    left = timedelta(seconds=round(seconds))
    days, rest = left.days, left.seconds
    hours, minutes, secs = rest // 3600, rest % 3600 // 60, rest % 60
    if days:
        return f"{days}d {hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m {secs}s" if secs else f"{minutes}m"
    return f"{secs}s"


def _first_line(value: object) -> str:
    return "—" if value is None else _text((str(value).splitlines() or [""])[0])


def _after_first_line(value: object) -> str:
    """An error's lines after its first (a traceback, a provider's reply): shown behind a
    disclosure whose summary is the first; empty when there is nothing more."""
    if value is None:
        return ""
    return "\n".join(printable(line) for line in str(value).splitlines()[1:]).strip("\n")


def noun(count: int, one: str, many: str | None = None) -> str:
    """`one` for a count of one, else its plural (`many`, or `one` + "s")."""
    return one if count == 1 else many or f"{one}s"


def counted(count: int, one: str, many: str | None = None) -> str:
    """`1 job`, `2 jobs`: a count with its noun agreeing."""
    return f"{count} {noun(count, one, many)}"


def _text(value: object) -> str:
    """User-controlled text made inert for display (control and bidi characters shown as
    escapes), then HTML-escaped by autoescape."""
    return "—" if value is None else printable(str(value))


def _pretty_json(text: str | None) -> str:
    if text is None:
        return "—"
    try:
        pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        return "\n".join(printable(line) for line in pretty.splitlines())
    except ValueError:
        return printable(text)


@jinja2.pass_context
def _path_for(context: dict[str, Any], name: str, /, **params: Any) -> str:
    """`url_for` in templates: a path (root path included), never scheme://host — a link
    cannot name another server, whatever the request's `Host` said."""
    return path_for(context["request"], name, **params)


def templates() -> Jinja2Templates:
    folder = resources.files("oncebox.console") / "templates"
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
    )
    env.globals["url_for"] = _path_for  # before Jinja2Templates, which only sets a default
    env.filters.update(
        when=_when,
        age=_age,
        text=_text,
        first_line=_first_line,
        after_first_line=_after_first_line,
        noun=noun,  # {{ n | noun('job') }}: the noun alone, after a figure shown apart
        counted=counted,  # {{ n | counted('job') }}: "1 job", "2 jobs"
        pretty_json=_pretty_json,
        kept=kept,
        kind_label=KIND_LABELS.get,
        limits_shown=limits_shown,
    )
    return Jinja2Templates(env=env)


def render(
    request: Request, session: Session | None, name: str, status_code: int = 200, **context: Any
) -> Response:
    notices = [] if session is None else sessions_of(request).take_notices(session)
    engine: Jinja2Templates = request.app.state.templates
    return engine.TemplateResponse(
        request,
        name,
        {
            "session": session,
            "notices": notices,
            "new_action_id": lambda: secrets.token_urlsafe(16),
            "settings": request.app.state.settings,
            **context,
        },
        status_code=status_code,
    )

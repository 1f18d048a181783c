"""The console's ASGI app: routes, the security headers around everything, static files."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import resources

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from oncebox.box import Box
from oncebox.console import actions, login, pages
from oncebox.console.batches import Batches
from oncebox.console.guard import Handler, PageFn, SecurityHeaders, action, page
from oncebox.console.login_token import LoginToken
from oncebox.console.refusals import RefusedLogins
from oncebox.console.render import templates
from oncebox.console.sessions import Sessions
from oncebox.console.throttle import LoginLimits, LoginThrottle
from oncebox.console.trends import Trends
from oncebox.console.users import User
from oncebox.kernel.public_url import HostCheck, PublicUrl
from oncebox.status import PeriodFigures

PERIODS_SHOWN = 12  # periods per schedule on the periods page (the overview shows the latest)


@dataclass(frozen=True)
class ConsoleSettings:
    """`users` empty: a one-time login token is made at start (`app.state.login_token`,
    `console.login_token`), nothing is open. `login`: the login throttle's limits and the
    audit's budget for refused logins.

    `public_url`: where browsers reach the console (`PublicUrl.of("https://ops.example/ops")`;
    `oncebox console` gives its `--public-url` or bind address). Given, a request naming
    another host is refused (400), a change counts only from its origins and cookies are
    `Secure` when it is https. None: the app it is mounted in checks `Host` itself (Starlette's
    `TrustedHostMiddleware`), and the request's own origin is the console's."""

    users: dict[str, User] = field(default_factory=dict)
    title: str = "oncebox"
    login: LoginLimits = field(default_factory=LoginLimits)
    public_url: PublicUrl | None = None


def view(handler: PageFn) -> Handler:
    """A page behind a login, which answers input it refuses with a 400 page (`refusing`)."""
    return page(pages.refusing(handler))


def create_app(box: Box, settings: ConsoleSettings | None = None) -> Starlette:
    """The console over `box`'s store. Under a path prefix, mount it or pass the prefix as the
    ASGI `root_path` (uvicorn's --root-path): every link and cookie follows it."""
    settings = settings or ConsoleSettings()
    static = resources.files("oncebox.console") / "static"
    routes = [
        Route("/", view(pages.overview), name="overview"),
        Route("/overview/tiles", view(pages.overview_tiles), name="overview_tiles"),
        Route("/trends.json", view(pages.trends), name="trends"),
        Route("/login", login.login_page, name="login"),
        Route("/login", login.login_submit, methods=["POST"], name="login_submit"),
        Route("/logout", login.logout, methods=["POST"], name="logout"),
        Route("/periods", view(pages.periods), name="periods"),
        Route("/periods/{schedule}/{period}", view(pages.period_detail), name="period"),
        Route("/jobs", view(pages.jobs), name="jobs"),
        Route("/outbox", view(pages.outbox), name="outbox"),
        Route("/keys", view(pages.key_search), name="key_search"),
        Route("/keys/{key:path}", view(pages.key_page), name="key"),
        Route("/dead", view(pages.dead), name="dead"),
        Route("/dead/plan", view(pages.dead_plan), name="dead_plan"),
        Route("/dead/batch", action(actions.run_batch), methods=["POST"], name="run_batch"),
        Route("/dead/batches/{batch}", view(pages.dead_batch), name="dead_batch"),
        Route("/dead/replay", action(actions.replay), methods=["POST"], name="replay"),
        Route("/dead/discard", action(actions.discard), methods=["POST"], name="discard"),
        Route("/held", view(pages.held), name="held"),
        Route("/held/resolve", action(actions.resolve), methods=["POST"], name="resolve"),
        Route("/audit", view(pages.audit), name="audit"),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]
    figures = PeriodFigures(box, PERIODS_SHOWN)
    trends = Trends(box.store)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        """The schedules' period figures read every job of their periods, so they are
        recomputed in the background, as the metrics exporter does, and pages show their age;
        the overview's chart is sampled in the background too."""
        stop = threading.Event()
        threads = [
            threading.Thread(target=figures.run, args=(stop,), name="period-figures", daemon=True),
            threading.Thread(target=trends.run, args=(stop,), name="trends", daemon=True),
        ]
        for thread in threads:
            thread.start()
        try:
            yield
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)

    middleware = [Middleware(SecurityHeaders)]
    if settings.public_url is not None:
        middleware.insert(0, Middleware(HostCheck, public=settings.public_url))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.figures = figures
    app.state.trends = trends
    app.state.batches = Batches(box)
    app.state.box = box
    app.state.settings = settings
    app.state.users = settings.users
    app.state.login_token = None if settings.users else LoginToken()
    app.state.sessions = Sessions()
    app.state.throttle = LoginThrottle(settings.login)
    app.state.refusals = RefusedLogins(box.store, settings.login)
    app.state.templates = templates()
    return app

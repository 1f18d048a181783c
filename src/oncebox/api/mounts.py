"""Several ASGI apps served as one — the API and the console under `/console` — with each app's
lifespan run: Starlette runs a mounted app's routes but not its lifespan, and both apps keep
threads there (the console's figures and trends, the API's fan-outs and its records' prune)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

from starlette.applications import Starlette
from starlette.routing import Mount


def beside(main: Starlette, others: Mapping[str, Starlette]) -> Starlette:
    """`main` at `/`, each of `others` under its prefix, every lifespan entered in turn."""
    apps = [*others.values(), main]

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            for app in apps:
                await stack.enter_async_context(app.router.lifespan_context(app))
            yield

    routes = [Mount(prefix, app) for prefix, app in others.items()] + [Mount("", main)]
    return Starlette(routes=routes, lifespan=lifespan)

"""The HTTP API: enqueue from any language, read a key's receipts, fire a schedule from any cron.

`create_api(box)` is an ASGI app (Starlette) over a box whose tasks and schedules are declared;
`oncebox serve` runs it, beside the console if asked. Every route needs an API key (`keys.py`)
with the route's scope; errors are RFC 9457 problem details (`problems.py`); a POST honours
`Idempotency-Key` (`idempotency.py`); `GET /openapi.json` and `GET /v1/discovery/{capability}`
describe it from the task registry itself (`describe.py`). See docs/api.md.

`create_api` and `ApiSettings` are imported when first asked for: Starlette comes with the
`console` extra, and `oncebox api-keys` (`keys.py`) must work without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oncebox.api.app import create_api
    from oncebox.api.settings import ApiSettings

__all__ = ["ApiSettings", "create_api"]


def __getattr__(name: str) -> Any:
    if name == "create_api":
        from oncebox.api.app import create_api  # noqa: PLC0415 (Starlette: an extra)

        return create_api
    if name == "ApiSettings":
        from oncebox.api.settings import ApiSettings  # noqa: PLC0415

        return ApiSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

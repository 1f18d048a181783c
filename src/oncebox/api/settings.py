"""What a deployment tunes of the API."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from oncebox.api.auth_failures import DEFAULT_LIMIT
from oncebox.runtime.trigger import TOLERANCE


@dataclass(frozen=True)
class ApiSettings:
    """`base_url`: where callers reach the API, the discovery examples' default;
    `fire_tolerance`: how early a schedule's trigger may arrive and still fire its period;
    `fan_out_threads`: fired schedules fanning out at once, after their answers;
    `auth_failures`: how many requests with a missing or wrong key an address may make per
    period before it is answered 429 until the period ends (`auth_failures.py`; None: never)."""

    title: str = "oncebox API"
    fire_tolerance: timedelta = TOLERANCE
    base_url: str = "http://127.0.0.1:8080"
    fan_out_threads: int = 2
    auth_failures: str | None = DEFAULT_LIMIT

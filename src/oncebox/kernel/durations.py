"""Durations as an operator types them — `30m`, `2h`, `1d`, `1h30m`, `45s` — for the CLI's options
and the console's filters alike."""

from __future__ import annotations

import re
from datetime import timedelta

from oncebox.kernel.errors import ConfigurationError

_DURATION = re.compile(r"(?:(\d{1,6})d)?(?:(\d{1,6})h)?(?:(\d{1,6})m)?(?:(\d{1,6})s)?")
_MOST = timedelta(days=36_500)


def parse_duration(text: str, option: str) -> timedelta:
    """A duration as an operator types it — `30m`, `2h`, `1d`, `1h30m`, `45s` — or a
    `ConfigurationError` naming `option` (a usage mistake: one line, exit 2)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if not text.strip() or match is None:
        raise ConfigurationError(f"{option} {text!r} is not a duration like 30m, 2h, 1d or 1h30m")
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    span = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    if span > _MOST:
        raise ConfigurationError(f"{option} {text!r} is longer than 100 years")
    return span


def check_keep(owner: str, label: str, value: object) -> None:
    """A retention setting on a task or channel (`keep_jobs=`, `keep_payloads=`, ...): None (the
    box's policy), `timedelta.max` (for ever) or a duration of 0 or more."""
    if value is not None and (not isinstance(value, timedelta) or value < timedelta(0)):
        raise ConfigurationError(f"{owner}: {label} must be a timedelta of 0 or more")

"""Numbers read from a URL's query (`?busy_timeout=10`, `?timeout=30`, `?window_hours=24`):
a value that is not a finite number within its range is a usage mistake named with its option,
not a negative timeout handed to a driver or an `inf` that overflows later."""

from __future__ import annotations

import math
from collections.abc import Mapping

from oncebox.kernel.errors import ConfigurationError


def number_option(
    options: Mapping[str, str], name: str, default: float, *, low: float, high: float, unit: str
) -> float:
    """`options[name]` as a float within [`low`, `high`], else `default` when absent."""
    text = options.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise ConfigurationError(
            f"{name}={text[:40]!r} must be a number of {unit} from {low:g} to {high:g}"
        )
    return value


FLAGS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


def flag_option(options: Mapping[str, str], name: str) -> bool | None:
    """`options[name]` as a yes/no (1/0, true/false, yes/no), None when absent: a value that is
    none of these is refused, not read as "no" (a mistyped `starttls=ture` must not turn TLS
    off)."""
    text = options.get(name)
    if text is None:
        return None
    value = FLAGS.get(text.strip().lower())
    if value is None:
        raise ConfigurationError(f"{name}={text[:40]!r} must be 1 or 0 (true/false, yes/no)")
    return value

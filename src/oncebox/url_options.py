"""Numbers read from a URL's query (`?busy_timeout=10`, `?timeout=30`, `?window_hours=24`):
a value that is not a finite number within its range is a usage mistake named with its option,
not a negative timeout handed to a driver or an `inf` that overflows later."""

from __future__ import annotations

import math
from collections.abc import Mapping

from oncebox.errors import ConfigurationError


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

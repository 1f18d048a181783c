"""The loop every background lane shares: run one bounded batch, wait, repeat until stopped.

A lane's `run_once()` does the work and returns counts; this loop only paces it. When a batch
was full the lane runs again at once; when the store is unavailable it backs off (doubling up to
`max_backoff`) and logs once per outage, so a database restart is a pause, not a crash. A
database that is damaged, unmigrated or no longer at its path ends the loop: its caller stops.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from oncebox.kernel.errors import SchemaError, StoreReplaced, StoreUnavailable

log = logging.getLogger("oncebox.lane")
C = TypeVar("C")


def configured(config: C | None, default: Callable[..., C], **loose: object) -> C:
    """A lane's config: `config`, or one built by `default` from the keyword arguments its
    constructor took before it took a config (those left None keep the config's defaults), so
    that the older calls mean what they meant. Both at once would leave one of them ignored."""
    given = {name: value for name, value in loose.items() if value is not None}
    if config is None:
        return default(**given)
    if given:
        raise TypeError(f"{', '.join(sorted(given))}: set in the config, not beside it")
    return config


def run_forever(
    name: str,
    run_once: Callable[[], bool],
    stop: threading.Event,
    interval: float,
    max_backoff: float = 30.0,
) -> None:
    """Call `run_once` until `stop` is set. It returns True when it should run again at once."""
    backoff = 0.0
    while not stop.is_set():
        try:
            again = run_once()
        except StoreUnavailable as exc:
            backoff = min(max(backoff * 2, 0.5), max_backoff)
            if backoff <= 0.5:
                log.warning("%s: %s; retrying with backoff", name, exc)
            stop.wait(backoff)
            continue
        except (SchemaError, StoreReplaced):  # no retry mends these: the worker stops on them
            raise
        except Exception:
            log.exception("%s failed; retrying in %.0fs", name, interval)
            stop.wait(interval)
            continue
        if backoff:
            log.info("%s: store reachable again", name)
            backoff = 0.0
        if not again:
            stop.wait(interval)

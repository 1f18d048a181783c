"""Channels: a name handlers write to (`"email"`), the provider that delivers it, and its policies.

    box.channel("email", provider="smtp://127.0.0.1:2525", limits=["14/s", "50000/day"],
                ambiguity="hold", retry=oncebox.Retry(max_attempts=8))

- `limits`: token buckets shared by every dispatcher (see `ratelimit.py`).
- `ambiguity`: what an unknown send outcome means on a provider **without** idempotency keys
  (plain SMTP): `hold` (default) — the row becomes `ambiguous`, visible, and nothing is sent
  again until it is resolved (`box.resolve`, or the provider's status lookup); `retry` — it is
  sent again and counted as a possible duplicate. On a provider **with** idempotency keys an
  unknown outcome is simply resent with the same key, until the provider's window has passed
  since the row was first leased; then it is `ambiguous` too.
- `retry`: attempts and backoff for retryable failures (5xx, SMTP 4xx, connection refused).
- `pause_on_421`: how long an SMTP 421 pauses the channel (SMTP has no Retry-After).
- `default_throttle` / `max_pause`: the pause for a 429 without a usable Retry-After, and the cap
  on any pause (absurd Retry-After values are capped and logged).
- `max_rescues`: how many times a dispatcher's lease may run out on a row with no outcome
  recorded (the dispatcher died, or hung) before the row stops going back to `pending` — a
  message that kills its dispatcher every time would otherwise loop for ever. Then it is dead
  (no send was attempted) or `ambiguous` (a send may have happened), with a reason saying so.
- `keep_payloads` / `keep_messages`: how long this channel's sent messages keep their payload,
  and their rows, instead of the box's `Retention` (`retention/policy.py`).
- `reports`: the provider's signed delivery webhooks (`deliveries/reports.py`): held sends it
  says it took are settled, and none is resent before their grace has passed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from oncebox.deliveries.reports import Reports
from oncebox.jobs.retry import Retry
from oncebox.jobs.tasks import check_name
from oncebox.kernel.durations import check_keep
from oncebox.kernel.errors import ConfigurationError
from oncebox.limits.rates import Limit
from oncebox.providers import DEFAULT_EMAIL_URL, Provider, from_url
from oncebox.providers.base import as_closing
from oncebox.store.params import BucketSpec

Ambiguity = Literal["hold", "retry"]
DEFAULT_CHANNEL_RETRY = Retry(
    max_attempts=8, base_delay=timedelta(seconds=5), max_delay=timedelta(hours=1)
)


@dataclass(frozen=True)
class Channel:
    name: str
    provider: Provider
    limits: tuple[Limit, ...] = ()
    ambiguity: Ambiguity = "hold"
    retry: Retry = DEFAULT_CHANNEL_RETRY
    pause_on_421: timedelta = timedelta(minutes=5)
    default_throttle: timedelta = timedelta(seconds=60)
    max_pause: timedelta = timedelta(hours=1)
    sender: str | None = None
    batch_size: int = 100
    max_rescues: int = 5
    extra: dict[str, str] = field(default_factory=dict)
    # None: the box's Retention.payloads / .messages (retention/policy.py)
    keep_payloads: timedelta | None = None
    keep_messages: timedelta | None = None
    reports: Reports | None = None

    @property
    def idempotent(self) -> bool:
        return bool(self.provider.idempotent)

    @property
    def window(self) -> timedelta | None:
        return self.provider.idempotency_window if self.idempotent else None

    def bucket_specs(self) -> list[BucketSpec]:
        return [BucketSpec(lim.name, float(lim.count), lim.refill_per_s) for lim in self.limits]


def make_channel(
    name: str,
    provider: Provider | str,
    *,
    limits: Sequence[str] = (),
    ambiguity: Ambiguity = "hold",
    retry: Retry | None = None,
    pause_on_421: timedelta = timedelta(minutes=5),
    default_throttle: timedelta = timedelta(seconds=60),
    max_pause: timedelta = timedelta(hours=1),
    sender: str | None = None,
    batch_size: int = 100,
    max_rescues: int = 5,
    keep_payloads: timedelta | None = None,
    keep_messages: timedelta | None = None,
    reports: Reports | None = None,
) -> Channel:
    check_name("channel", name)
    if ambiguity not in ("hold", "retry"):
        raise ConfigurationError(f"channel {name!r}: ambiguity must be 'hold' or 'retry'")
    if not 1 <= batch_size <= 1000:
        raise ConfigurationError(f"channel {name!r}: batch_size must be within 1..1000")
    if not isinstance(max_rescues, int) or not 1 <= max_rescues <= 100:
        raise ConfigurationError(f"channel {name!r}: max_rescues must be an int within 1..100")
    for value, label in (
        (pause_on_421, "pause_on_421"),
        (default_throttle, "default_throttle"),
        (max_pause, "max_pause"),
    ):
        if value <= timedelta(0):
            raise ConfigurationError(f"channel {name!r}: {label} must be positive")
    if reports is not None and not isinstance(reports, Reports):
        raise ConfigurationError(f"channel {name!r}: reports must be oncebox.Reports(...)")
    check_keep(f"channel {name!r}", "keep_payloads", keep_payloads)
    check_keep(f"channel {name!r}", "keep_messages", keep_messages)
    parsed = tuple(Limit.parse(text) for text in limits)
    if len({lim.name for lim in parsed}) != len(parsed):
        raise ConfigurationError(f"channel {name!r}: a limit is listed twice")
    return Channel(
        name=name,
        provider=from_url(provider) if isinstance(provider, str) else provider,
        limits=parsed,
        ambiguity=ambiguity,
        retry=retry or DEFAULT_CHANNEL_RETRY,
        pause_on_421=pause_on_421,
        default_throttle=default_throttle,
        max_pause=max_pause,
        sender=sender,
        batch_size=batch_size,
        max_rescues=max_rescues,
        keep_payloads=keep_payloads,
        keep_messages=keep_messages,
        reports=reports,
    )


class ChannelSet:
    """The channels a box declares. Handlers write to `email` unless told otherwise, so an
    `email` channel exists even when none was declared: on `ONCEBOX_EMAIL`, or the embedded
    default (`file://oncebox-outbox`)."""

    def __init__(self) -> None:
        self._declared: dict[str, Channel] = {}

    def declare(self, name: str, provider: Provider | str | None, **policies: Any) -> Channel:
        url = (
            provider if provider is not None else os.environ.get("ONCEBOX_EMAIL", DEFAULT_EMAIL_URL)
        )
        channel = make_channel(name, url, **policies)
        self._declared[name] = channel
        return channel

    def add(self, channel: Channel) -> Channel:
        """Add a channel oncebox made itself (a relay's `~broker.<queue>`: `~` names are
        oncebox's, refused to `declare`)."""
        self._declared[channel.name] = channel
        return channel

    def all(self) -> dict[str, Channel]:
        if "email" not in self._declared:
            self.declare("email", None)
        return dict(self._declared)

    def close(self) -> None:
        """Close the providers that hold connections (SMTP sessions, HTTP pools)."""
        for channel in self._declared.values():
            provider = as_closing(channel.provider)
            if provider is not None:
                provider.close()

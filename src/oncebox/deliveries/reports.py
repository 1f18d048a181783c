"""A channel's provider reports: where their signing secret is, and how long a held send waits
for one before anything else may settle it.

    box.channel("email", provider="resend://", reports=oncebox.Reports(
        secret_env="RESEND_WEBHOOK_SECRET", grace=timedelta(hours=2), unreported="hold"))

- `secret_env`: the environment variable holding the webhook signing secret (`whsec_…`, as the
  provider shows it); read when the receiver starts, never logged.
- `grace`: a held send is not resent — by a lookup that cannot find it, or by `unreported` —
  until this long after it was held: a provider's event may still be on its way (their webhooks
  retry for hours, and arrive out of order).
- `unreported`: a held send with no event after the grace stays held for a person (`hold`, the
  default), or is resent (`resend`) — only for a provider that reports every message it takes,
  whose silence for the whole grace means it never took it.
- `tolerance`: how far a webhook's signed timestamp may be from this host's clock (a replay
  window): five minutes, as Svix and Standard Webhooks receivers use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from oncebox.kernel.errors import ConfigurationError

Unreported = Literal["hold", "resend"]
DEFAULT_GRACE = timedelta(hours=1)


@dataclass(frozen=True)
class Reports:
    secret_env: str
    grace: timedelta = DEFAULT_GRACE
    unreported: Unreported = "hold"
    tolerance: timedelta = timedelta(minutes=5)

    def __post_init__(self) -> None:
        if not isinstance(self.secret_env, str) or not self.secret_env.strip():
            raise ConfigurationError("Reports(secret_env=...) names an environment variable")
        if not isinstance(self.grace, timedelta) or self.grace < timedelta(0):
            raise ConfigurationError("Reports(grace=...) is a timedelta of zero or more")
        if self.unreported not in ("hold", "resend"):
            raise ConfigurationError("Reports(unreported=...) is 'hold' or 'resend'")
        if not isinstance(self.tolerance, timedelta) or self.tolerance <= timedelta(0):
            raise ConfigurationError("Reports(tolerance=...) is a positive timedelta")

    def secret(self, channel: str) -> str:
        """The signing secret, from the environment; a clear error when it is not set."""
        value = os.environ.get(self.secret_env, "")
        if not value:
            raise ConfigurationError(
                f"channel {channel!r}: its provider reports are signed with the secret in "
                f"${self.secret_env}, which is not set"
            )
        return value

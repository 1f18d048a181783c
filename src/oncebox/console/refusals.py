"""The audit of refused console logins: from where, for which name, and why.

Each refusal — a wrong password, a name no user has, a name longer than any user's, an attempt
the throttle refused — is an entry in the store's audit log: action `login-refused`, target
`login`, the client's address as the actor, the submitted name inert and cut to NAME_SHOWN
characters, the reason in words and, in `details`, as JSON (`why`, `name`, `name_chars`,
`address`, `refusals`, `retry_after_s`). The Audit page shows them (filter by the action).

It cannot become a flood of its own. Wrong passwords are only as many as the throttle lets
through; a throttled (name, address) is audited once per window, its entry counting the
refusals since its last one (`Verdict.audited`, counted by the throttle); and all refusals
together write at most `LoginLimits.audit_budget` entries per window — past it they are
counted, and the first refusal of the next window writes one entry saying how many went
unaudited. Retention prunes these entries with the rest of the audit log (`Retention.audit`).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Literal

from oncebox.console.throttle import LoginLimits, Verdict
from oncebox.console.users import MAX_NAME_CHARS
from oncebox.kernel.client_address import ADDRESS_CHARS
from oncebox.kernel.errors import OnceboxError
from oncebox.kernel.inert import printable
from oncebox.store.params import AuditEntry
from oncebox.store.protocol import Store

Why = Literal["wrong-password", "unknown-name", "name-too-long", "throttled"]
ACTION = "login-refused"
NAME_SHOWN = 64  # characters of a submitted name the audit keeps
log = logging.getLogger("oncebox.console")


def shown_name(name: str) -> str:
    """A submitted name as the audit keeps it: inert, at most NAME_SHOWN characters of it."""
    return printable(name[:NAME_SHOWN]) + ("…" if len(name) > NAME_SHOWN else "")


class RefusedLogins:
    """Writes the audit entries of refused logins, within the budget (see the module)."""

    def __init__(self, store: Store, limits: LoginLimits) -> None:
        self._store, self._limits = store, limits
        self._lock = threading.Lock()
        self._window_start: float | None = None
        self._written = 0  # entries written in the current window
        self._unaudited = 0  # refusals past the budget in the current window

    def record(self, verdict: Verdict, address: str, name: str, why: Why) -> None:
        """Audit one refusal (blocking: call it in a thread). A store that cannot take the
        entry is logged, never raised: the refusal stands either way."""
        refusals = verdict.audited if why == "throttled" else 1
        if refusals == 0:  # a throttled (name, address) already audited in this window
            return
        entry = self._entry(refusals, address, name, why, verdict)
        for written in self._within_budget(verdict.at, refusals, entry):
            try:
                self._store.audit_append(written)
            except OnceboxError as exc:
                log.warning(
                    "a refused login from %s could not be audited: %s",
                    printable(address[:ADDRESS_CHARS]),
                    printable(str(exc)),
                )

    def _within_budget(self, now: float, refusals: int, entry: AuditEntry) -> list[AuditEntry]:
        """`entry` when the window's budget has room for it, after a summary of the refusals
        the last window left unaudited; else nothing, and `refusals` counted."""
        entries = []
        with self._lock:
            window_over = (
                self._window_start is None or now - self._window_start >= self._limits.window_s
            )
            if window_over:
                if self._unaudited:
                    entries.append(self._summary(self._unaudited))
                self._window_start, self._written, self._unaudited = now, 0, 0
            if self._written >= self._limits.audit_budget:
                self._unaudited += refusals
                return entries
            self._written += 1
        return [*entries, entry]

    def _entry(
        self, refusals: int, address: str, name: str, why: Why, verdict: Verdict
    ) -> AuditEntry:
        shown, minutes = shown_name(name), _minutes(self._limits.window_s)
        if why == "wrong-password":
            reason = f"wrong password for '{shown}'"
        elif why == "unknown-name":
            reason = f"no user is named '{shown}'"
        elif why == "name-too-long":
            reason = f"a name of {len(name)} characters (at most {MAX_NAME_CHARS}): '{shown}'"
        elif verdict.refused_by == "address":
            reason = (
                f"throttled: {refusals} attempt(s) for '{shown}' refused, this address having "
                f"failed {self._limits.per_address} times for the name within {minutes}; "
                f"it may try again in {verdict.wait_s} s"
            )
        else:
            reason = (
                f"throttled: {refusals} attempt(s) for '{shown}' refused while the name waits "
                f"after failures from several addresses; try again in {verdict.wait_s} s"
            )
        details = {
            "why": why,
            "name": shown,
            "name_chars": len(name),
            "address": printable(address[:ADDRESS_CHARS]),
            "refusals": refusals,
            "retry_after_s": verdict.wait_s if why == "throttled" else None,
        }
        return AuditEntry(
            actor=printable(address[:ADDRESS_CHARS]),
            action=ACTION,
            target_kind="login",
            reason=reason,
            details=json.dumps(details),
        )

    def _summary(self, unaudited: int) -> AuditEntry:
        budget, minutes = self._limits.audit_budget, _minutes(self._limits.window_s)
        return AuditEntry(
            actor="console",
            action=ACTION,
            target_kind="login",
            reason=(
                f"{unaudited} refused login(s) not audited one by one: more than {budget} "
                f"within {minutes} (each was refused all the same)"
            ),
            details=json.dumps({"why": "over-budget", "refusals": unaudited}),
        )


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min"

"""The hold's expiry: fifteen minutes after it is placed, once."""

from __future__ import annotations

from datetime import timedelta

from holds.models import Hold, HoldEvent
from oncebox import JobContext
from oncebox.contrib.django import box

HOLD_FOR = timedelta(minutes=15)


@box.task(key="hold-expired/hold-{hold_id}")
def expire_hold(ctx: JobContext, hold_id: int) -> None:
    """Runs in the claim's transaction: the hold's new state, its event row, the intent and the
    email's outbox row commit together — or, if anything here raises, none of them."""
    hold = Hold.objects.filter(pk=hold_id).first()
    if hold is None or hold.state != "held":
        return  # confirmed or cancelled meanwhile: nothing to expire
    hold.state = "expired"
    hold.save(update_fields=["state"])
    HoldEvent.objects.create(hold=hold, what="expired")
    ctx.outbox.email(
        to=hold.guest_email,
        subject="Your room hold has expired",
        text=f"Hold {hold.pk} for {hold.nights} night(s) has expired.",
    )

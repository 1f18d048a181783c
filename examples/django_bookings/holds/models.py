"""A room hold, and what happened to it."""

from __future__ import annotations

from typing import ClassVar

from django.db import models


class Hold(models.Model):  # type: ignore[misc]
    guest_email = models.CharField(max_length=320)
    nights = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=16, default="held")

    class Meta:
        constraints: ClassVar[list[models.BaseConstraint]] = [
            models.CheckConstraint(
                condition=models.Q(nights__gte=1, nights__lte=30), name="holds_nights"
            )
        ]


class HoldEvent(models.Model):  # type: ignore[misc]
    """One row per thing that happened to a hold: the expiry writes one, with the hold's new
    state and the guest's email, in the claim's transaction."""

    hold = models.ForeignKey(Hold, on_delete=models.CASCADE)
    what = models.CharField(max_length=32)
    at = models.DateTimeField(auto_now_add=True)

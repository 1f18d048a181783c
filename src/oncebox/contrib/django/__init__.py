"""oncebox for Django: add `"oncebox.contrib.django"` to INSTALLED_APPS, declare tasks on
`box` in each app's `tasks.py`, run `manage.py migrate`, then `manage.py oncebox_worker`.

    # myapp/tasks.py
    from oncebox.contrib.django import box

    @box.task(key="hold-expired/hold-{hold_id}")
    def expire_hold(ctx, hold_id: int) -> None:
        Hold.objects.filter(pk=hold_id, state="held").update(state="expired")  # in the claim

    # myapp/views.py
    with transaction.atomic():
        hold = Hold.objects.create(...)
        box.enqueue(expire_hold, hold_id=hold.pk, delay=HOLD_FOR)  # commits with the hold

Settings: `settings.ONCEBOX` (conf.py). The guide's Django section says what holds and why.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "box":
        from oncebox.contrib.django.project import get_box  # noqa: PLC0415 (after Django's set-up)

        return get_box()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["box"]

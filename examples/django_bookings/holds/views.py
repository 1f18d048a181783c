"""POST /holds places a hold and enqueues its expiry in one transaction; GET /holds/N shows it."""

from __future__ import annotations

import json

from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from holds.models import Hold
from holds.tasks import HOLD_FOR, expire_hold
from oncebox.contrib.django import box
from oncebox.jobs.receipts import receipt_chain


@csrf_exempt
@require_POST
def place_hold(request: HttpRequest) -> JsonResponse:
    """The hold and its expiry commit together: a request the database refuses after the
    enqueue (too many nights, a hold already placed) leaves neither."""
    try:
        body = json.loads(request.body)
        hold_id, email, nights = int(body["id"]), str(body["guest_email"]), int(body["nights"])
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"detail": "give id, guest_email and nights"}, status=400)
    try:
        with transaction.atomic():
            expiry = box.enqueue(expire_hold, hold_id=hold_id, delay=HOLD_FOR)  # joins the block
            Hold.objects.create(id=hold_id, guest_email=email, nights=nights)
    except IntegrityError as refused:
        if "holds_nights" in str(refused):
            return JsonResponse({"detail": "nights must be 1 to 30"}, status=422)
        return JsonResponse({"detail": f"hold {hold_id} was already placed"}, status=409)
    return JsonResponse({"hold": hold_id, "expiry_job": expiry.job_id}, status=201)


@require_GET
def hold_status(request: HttpRequest, hold_id: int) -> JsonResponse:
    hold = Hold.objects.filter(pk=hold_id).first()
    if hold is None:
        return JsonResponse({"detail": "no such hold"}, status=404)
    chain = receipt_chain(box.store, f"hold-expired/hold-{hold_id}")
    return JsonResponse(
        {
            "hold": hold_id,
            "state": hold.state,
            "expiry": [receipt.job.state for receipt in chain.jobs],
            "emails": [message.message.state for message in chain.messages],
        }
    )

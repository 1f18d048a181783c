from __future__ import annotations

from django.urls import path
from holds import views

urlpatterns = [
    path("holds", views.place_hold),
    path("holds/<int:hold_id>", views.hold_status),
]

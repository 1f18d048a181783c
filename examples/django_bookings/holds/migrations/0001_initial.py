"""The holds and their events (made by `manage.py makemigrations holds`, then formatted)."""

from __future__ import annotations

from typing import Any, ClassVar

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [
        migrations.CreateModel(
            name="Hold",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("guest_email", models.CharField(max_length=320)),
                ("nights", models.PositiveSmallIntegerField()),
                ("state", models.CharField(default="held", max_length=16)),
            ],
            options={
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("nights__gte", 1), ("nights__lte", 30)),
                        name="holds_nights",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="HoldEvent",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("what", models.CharField(max_length=32)),
                ("at", models.DateTimeField(auto_now_add=True)),
                (
                    "hold",
                    models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="holds.hold"),
                ),
            ],
        ),
    ]

"""oncebox's schema, through version 13: see `oncebox/contrib/django/schema.py`."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from oncebox.contrib.django.schema import migrate_schema, refuse_reverse


class Migration(migrations.Migration):  # type: ignore[misc]
    atomic = False  # oncebox's migrator is one transaction of its own (schema.py)
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(migrate_schema, refuse_reverse, elidable=False)
    ]

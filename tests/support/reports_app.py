"""An app whose email channel takes its provider's delivery webhooks: `--app support.reports_app`
(the signing secret in ONCEBOX_TEST_REPORTS_SECRET)."""

from __future__ import annotations

from oncebox import Reports
from oncebox.examples.logistics.app import build_box
from support.reports import SECRET_ENV

box = build_box()
box.channel("email", provider="null:", reports=Reports(secret_env=SECRET_ENV))

"""Programs from Debian's packages that some tests need (promtool, prometheus): `make test`
installs them (`tools/system-packages`). Where they cannot be installed, their tests skip with
a loud reason — except in CI (`CI=true`), where a missing program fails the run."""

from __future__ import annotations

import os
import shutil

import pytest


def require(program: str, package: str) -> str:
    """The path of `program`, or skip (fail in CI) naming the package that provides it."""
    found = shutil.which(program)
    if found is not None:
        return found
    message = f"{program} is not installed (Debian package {package}; `make test` installs it)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message + " (required in CI)")
    pytest.skip(f"!!! SKIPPING: {message} !!!")

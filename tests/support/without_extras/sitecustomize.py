"""Put this folder first on PYTHONPATH and the interpreter starts as if oncebox had been installed
without its extras (`pip install oncebox`): importing a module named in ONCEBOX_TEST_HIDDEN
(space-separated top-level names) fails as a module that is not installed fails. Python imports
`sitecustomize` at start-up, so every process the command starts inherits it too."""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

HIDDEN = frozenset(os.environ.get("ONCEBOX_TEST_HIDDEN", "").split())


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name.partition(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())

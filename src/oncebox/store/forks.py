"""Stores across a fork: a child forgets the connections it inherited.

A Box made before a fork (gunicorn's --preload, a multiprocessing pool) is shared by the
children's copies of it. Each copy must open connections of its own: two processes writing one
connection's protocol stream corrupt both sessions. Nor does a child close what it inherited:
SQLite forbids touching a connection carried across a fork at all, and a close is the driver's
business with the parent's socket, not the child's. The inherited objects are kept, untouched,
for the child's lifetime. Registered once per process; stores are held weakly, so a closed store
is forgotten.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class ForkAware(Protocol):
    def forget_inherited(self) -> list[object]:
        """Drop this process's references to inherited connections (returned, to be kept)."""
        ...


_STORES: weakref.WeakSet[ForkAware] = weakref.WeakSet()
_INHERITED: list[object] = []  # kept alive in a child: never used, closed or finalised


def watch(store: ForkAware) -> None:
    _STORES.add(store)


def _after_fork_in_child() -> None:
    for store in list(_STORES):
        _INHERITED.extend(store.forget_inherited())


os.register_at_fork(after_in_child=_after_fork_in_child)

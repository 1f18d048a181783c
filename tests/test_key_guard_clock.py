"""The key guard trusts a verified canary for a minute of the kernel's monotonic clock, read at
each check: so a clock put in its place — the simulation's virtual time — governs when the
canaries are read again, and a world replays alike however long it runs on the host."""

from __future__ import annotations

from pathlib import Path

import pytest

from oncebox.box import Box
from oncebox.kernel import clock
from oncebox.store.reads import ReadOperations


def test_a_verified_canary_is_read_again_after_a_minute_of_the_kernel_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    now = [1_000.0]
    monkeypatch.setattr(clock, "monotonic", lambda: now[0])
    box = Box(f"sqlite:///{tmp_path / 'o.db'}")

    @box.task(key="digest/{customer}")
    def digest(ctx: object, customer: int) -> None:
        pass

    reads: list[str] = []
    read = ReadOperations.key_canary_get

    def counted(self: ReadOperations, kind: str, name: str) -> object:
        reads.append(name)
        return read(self, kind, name)

    monkeypatch.setattr(ReadOperations, "key_canary_get", counted)
    guard = box.runtime.key_guard
    guard.require_task(digest)  # first seen: read, recorded
    assert reads
    reads.clear()
    now[0] += 59.0
    guard.require_task(digest)
    assert reads == []  # trusted within the minute: not read again
    now[0] += 2.0
    guard.require_task(digest)
    assert reads == [digest.name]  # past it, by the kernel's clock: read again
    box.close()

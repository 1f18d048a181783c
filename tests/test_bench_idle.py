"""bench/idle.py measures its window only once the worker has said it is ready (its start line,
from `Worker.run(on_start=…)`), however long the worker takes to start: a loaded machine took
~3 s to import it, and a fixed warm-up used to stop the worker before it ran (issue 43, 6a)."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
START = "worker started: sqlite:///x.db · app bench/idle.py · tasks idle · channels email"


@pytest.fixture
def idle(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """bench/idle.py as a module; the bench folder it puts on sys.path, and the modules it
    imports from there, are taken back after the test."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location("bench_idle", BENCH / "idle.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    for name, loaded in list(sys.modules.items()):
        if BENCH in Path(getattr(loaded, "__file__", None) or "/").parents:
            del sys.modules[name]


class LateWorker:
    """A worker process as `wait_until_ready` sees it: its output holds `first`; on its
    `late`-th poll it writes `then` there and, with `code`, has exited."""

    def __init__(
        self, output: Path, *, first: str, late: int, then: str, code: int | None = None
    ) -> None:
        self.output, self.late, self.then, self.code, self.polls = output, late, then, code, 0
        output.write_text(first)

    def poll(self) -> int | None:
        self.polls += 1
        if self.polls < self.late:
            return None
        if self.polls == self.late:
            with self.output.open("a") as out:
                out.write(self.then)
        return self.code


def test_the_wait_lasts_until_the_worker_prints_its_start_line(idle, tmp_path):
    worker = LateWorker(
        tmp_path / "worker.out", first="importing, slowly\n", late=4, then=START + "\n"
    )
    assert idle.wait_until_ready(worker, worker.output, timeout=60) == START
    assert worker.polls == 4  # it looked until the line came, not before, nor after


def test_a_start_line_still_being_written_is_not_taken_as_said(idle, tmp_path):
    cut = len("worker started: sqlite:///")
    worker = LateWorker(tmp_path / "worker.out", first=START[:cut], late=3, then=START[cut:] + "\n")
    assert idle.wait_until_ready(worker, worker.output, timeout=60) == START
    assert worker.polls == 3


def test_a_worker_that_exits_before_it_is_ready_is_named_with_its_output(idle, tmp_path):
    worker = LateWorker(
        tmp_path / "worker.out",
        first="importing, slowly\n",
        late=2,
        then="ImportError: no module named 'nowhere'\n",
        code=1,
    )
    with pytest.raises(SystemExit) as raised:
        idle.wait_until_ready(worker, worker.output, timeout=60)
    said = str(raised.value)
    assert "exited (code 1) before it was ready" in said, said
    assert "importing, slowly" in said and "ImportError: no module named 'nowhere'" in said, said
    assert worker.polls == 2


def test_a_worker_never_ready_is_given_up_on_with_its_output(idle, tmp_path):
    worker = LateWorker(tmp_path / "worker.out", first="importing, slowly\n", late=2, then="")
    with pytest.raises(SystemExit) as raised:
        idle.wait_until_ready(worker, worker.output, timeout=0)
    said = str(raised.value)
    assert "not ready within 0 s" in said and "importing, slowly" in said, said


def test_a_slow_starting_worker_is_measured_for_a_whole_window_after_it_is_ready(
    idle, tmp_path, monkeypatch
):
    """The worker's interpreter starts 2 s late (a sitecustomize on its PYTHONPATH), far past
    the warm-up and window asked for (0 + 0.5 s): the old fixed warm-up sent SIGTERM while it was
    still starting, and it died without its transaction log. Now the window begins after its
    start line, so after that delay ended."""
    slow = tmp_path / "slow"
    slow.mkdir()
    released = tmp_path / "released"
    (slow / "sitecustomize.py").write_text(
        textwrap.dedent(
            f"""
            import time
            time.sleep(2.0)  # a slow import on a loaded machine
            with open({str(released)!r}, "w") as out:
                out.write(repr(time.time()))
            """
        )
    )
    monkeypatch.setenv("PYTHONPATH", str(slow))  # the worker's process only: this one has started
    db = tmp_path / "idle.db"
    figures = idle.watch_idle(f"sqlite:///{db}", 0.5, 0.0, None, ready_timeout=90)
    assert released.exists(), "the worker did not start through the slow sitecustomize"
    assert float(released.read_text()) <= figures["window_start"], figures
    assert figures["worker_per_s"] == figures["worker_transactions"] / 0.5

"""Named points in the code where tests and the chaos harness can intervene.

`reach("consumer.after_claim_insert")` does nothing unless an action is installed for that name;
switched off, a point costs one dictionary lookup. Actions can observe (signal a waiting test),
pause on a barrier the test releases, raise, or kill the process with SIGKILL (no `finally`, no
atexit). Tests synchronise on these points, never on sleeps.

Points (each documented where it is reached):
    consumer.found_nothing             a consumer's lease came back empty
    consumer.leased                    a batch was leased (committed), before any transaction
    consumer.before_transaction        just before a consumer transaction begins
    consumer.after_claim_insert        intents inserted, handlers not yet run (inside the tx)
    consumer.before_handler            a handler is about to run (inside the tx)
    consumer.after_handler_before_commit  all settled, about to commit (inside the tx)
    consumer.committed                 the consumer transaction committed
    consumer.lease_lost                a fenced settlement found a superseded lease
    dispatcher.found_nothing           a dispatcher's lease came back empty
    resolver.judged                    the resolver decided what to do with a held row from the
                                       page it read (and its lookup); its write is next
    provider_event.recorded            a provider's event recorded and its message counted and
                                       locked, its transaction not yet committed
    worker.woken                       a worker woke its polling lanes (new work may exist)
    schedule.take_over_before_write    an operator's take-over read the run and judged its
                                       owner gone; its fenced write is next
    sqlite.waiting_turn                a SQLite writer waits for its turn at the write lock (the
                                       simulation lets another actor step here)
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

Action = Callable[[str], None]

_actions: dict[str, Action] = {}


def reach(name: str) -> None:
    """Called by the code at a named point; runs the installed action, if any."""
    action = _actions.get(name)
    if action is not None:
        action(name)


def install(name: str, action: Action) -> None:
    _actions[name] = action


def remove(name: str) -> None:
    _actions.pop(name, None)


@contextmanager
def installed(actions: Mapping[str, Action]) -> Iterator[None]:
    """Install actions for the duration of a block (tests)."""
    previous = {name: _actions.get(name) for name in actions}
    _actions.update(actions)
    try:
        yield
    finally:
        for name, old in previous.items():
            if old is None:
                _actions.pop(name, None)
            else:
                _actions[name] = old


def kill(_name: str) -> None:
    """SIGKILL this process: nothing after the point runs, not even `finally` blocks."""
    os.kill(os.getpid(), signal.SIGKILL)


def raising(exc: BaseException) -> Action:
    def action(_name: str) -> None:
        raise exc

    return action


class Pause:
    """Blocks the thread that reaches the point until the test releases it.

    `only` restricts the pause to threads whose name it accepts, so one worker of several can be
    held while the others run. `reached` is set when a thread arrives; `release()` lets it go.
    """

    def __init__(self, only: Callable[[str], bool] | None = None, timeout: float = 60.0) -> None:
        self.reached = threading.Event()
        self._release = threading.Event()
        self._only = only
        self._timeout = timeout

    def __call__(self, name: str) -> None:
        if self._only is not None and not self._only(threading.current_thread().name):
            return
        self.reached.set()
        if not self._release.wait(self._timeout):
            raise TimeoutError(f"point {name} was never released")

    def release(self) -> None:
        self._release.set()


class Signal:
    """Records every arrival; `wait(n)` blocks until the point was reached `n` times."""

    def __init__(self) -> None:
        self._count = 0
        self._cond = threading.Condition()

    def __call__(self, _name: str) -> None:
        with self._cond:
            self._count += 1
            self._cond.notify_all()

    @property
    def count(self) -> int:
        with self._cond:
            return self._count

    def wait(self, times: int = 1, timeout: float = 30.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._count >= times, timeout)

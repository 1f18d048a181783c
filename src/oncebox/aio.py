"""The awaitable surface: what a web request does, without blocking its event loop.

`box.aio.enqueue(...)`, `enqueue_many`, `cancel` and `receipts` run the sync core — the same
checks, statements and parameters (STYLE.md §1) — in a worker thread, so the loop never waits
on the database: not on a lock held by another transaction, not on a slow server. Given the
caller's async connection (psycopg's `AsyncConnection`, SQLAlchemy's `AsyncSession` or
`AsyncConnection` on postgresql+psycopg), the job is written in the caller's transaction: each
statement is sent on that connection by the loop that owns it (`store/caller.py`,
`LoopConnection`). Cancelled there, a call stops where it is — the statement in flight cancelled
on the server, none sent after it — and the cancel reaches the caller once the call has stopped,
so the caller's rollback comes after the call's last statement, never before one. Without a
connection, the call's own transaction commits or not as a whole; a cancel does not stop it.

The worker stays synchronous: a handler runs inside the claim's transaction on a connection the
lane holds, and async handlers would add a loop per lane for no gain in what the lane waits on
(the database and the provider, one job at a time per transaction). See the guide.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from oncebox.jobs.receipts import ReceiptChain, receipt_chain
from oncebox.jobs.tasks import Task
from oncebox.runtime import enqueue as enqueueing
from oncebox.runtime.enqueue import EnqueueManyResult, EnqueueResult
from oncebox.runtime.operations import ActionOutcome, Operations
from oncebox.runtime.runtime import Runtime
from oncebox.store.caller import LoopConnection, loop_connection

P = ParamSpec("P")
T = TypeVar("T")


class AsyncBox:
    """`box.aio`: the box's request-side operations, awaitable."""

    def __init__(self, runtime: Runtime, operations: Operations) -> None:
        self._runtime = runtime
        self._operations = operations

    async def enqueue(
        self,
        task: Task | str | Callable[..., Any],
        /,
        *,
        connection: object | None = None,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
        priority: int | None = None,
        **args: Any,
    ) -> EnqueueResult:
        """`Box.enqueue`, awaited; in the caller's transaction on an async `connection`."""
        return await self.enqueue_args(
            task, args, connection=connection, run_at=run_at, delay=delay, priority=priority
        )

    async def enqueue_args(
        self,
        task: Task | str | Callable[..., Any],
        args: Mapping[str, Any],
        *,
        connection: object | None = None,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
        priority: int | None = None,
    ) -> EnqueueResult:
        bridged = await loop_connection(connection, self._runtime.store.dialect)
        return await in_thread(
            bridged,
            enqueueing.enqueue,
            self._runtime,
            task,
            args,
            connection=bridged,
            run_at=run_at,
            delay=delay,
            priority=priority,
        )

    async def enqueue_many(
        self,
        task: Task | str | Callable[..., Any],
        args_list: Iterable[Mapping[str, Any]],
        *,
        connection: object | None = None,
        run_at: datetime | None = None,
        delay: timedelta | None = None,
        priority: int | None = None,
    ) -> EnqueueManyResult:
        """`Box.enqueue_many`, awaited; in the caller's transaction on an async `connection`."""
        bridged = await loop_connection(connection, self._runtime.store.dialect)
        return await in_thread(
            bridged,
            enqueueing.enqueue_many,
            self._runtime,
            task,
            list(args_list),
            connection=bridged,
            run_at=run_at,
            delay=delay,
            priority=priority,
        )

    async def cancel(
        self, key_or_id: str | int, *, reason: str = "cancelled", actor: str = "api"
    ) -> ActionOutcome:
        """`Box.cancel`, awaited (a ready job; audited)."""
        return await asyncio.to_thread(
            self._operations.cancel, key_or_id, reason=reason, actor=actor
        )

    async def receipts(self, key: str) -> ReceiptChain:
        """A key's receipt chain — its intent, jobs, messages and audit — awaited."""
        return await asyncio.to_thread(receipt_chain, self._runtime.store, key)


async def in_thread(
    bridged: LoopConnection | None, call: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
) -> T:
    """`call` in a worker thread. On the caller's connection (`bridged`), a cancel stops it —
    nothing is sent after it — and is raised once it has stopped (the module docstring)."""
    work = asyncio.ensure_future(asyncio.to_thread(call, *args, **kwargs))
    if bridged is None:
        return await work
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        bridged.cancel()
        await asyncio.wait([work])  # it stops at its next statement, or as the one in flight ends
        if not work.cancelled():
            work.exception()  # what it raised is the cancel, said by the raise below
        raise

"""The process-wide half of the mutations (`chaos/mutations.py` holds the catalogue and the
query rewrites): each switch replaces one piece of oncebox in this process — a method, a
module's function, a point's action — by the version from before its fix, and `undo` puts every
one back. Only the harness and the tests that catch a mutation switch them on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from oncebox.jobs import transitions
from oncebox.kernel import clock, points
from oncebox.queue.transport import Delivery, TableTransport
from oncebox.store.params import JobFinish

# What a mutation replaced in this process, to put back after the run (module, name, value).
_PATCHED: list[tuple[Any, str, Any]] = []
# What a mutation installed otherwise (a point's action), to take away after the run.
_UNDO: list[Callable[[], None]] = []
_APPLIED: set[str] = set()


def patch(module: Any, name: str, value: Any) -> None:
    _PATCHED.append((module, name, getattr(module, name)))
    setattr(module, name, value)


def _stale_given_back() -> None:
    from oncebox.brokers.transport import BrokerTransport  # noqa: PLC0415

    def give_back(self: Any, stale: list[Any]) -> None:
        self._quietly(self.queue.give_back, stale)

    patch(BrokerTransport, "_settle_stale", give_back)


def _aio_ignores_cancel() -> None:
    from oncebox import aio  # noqa: PLC0415

    async def in_thread(_bridged: Any, call: Any, /, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(call, *args, **kwargs)  # a cancel leaves the thread going

    patch(aio, "in_thread", in_thread)


# The relay trigger's head fence (PostgreSQL 0023): no other job of the group relayed with its
# publish written. `AND false` makes that NOT EXISTS always true.
_HEAD_FENCE = "AND g.id <> j.id"


def unfence_group_heads(store: Any) -> None:
    """Rewrite the relay trigger's function in `store`'s database without its head fence (the
    function is schema, not a named query: each database a mutated store opens is rewritten)."""
    with store.connect(autocommit=True) as conn:
        name = f"{store.schema}.oncebox_jobs_relay"
        [(definition,)] = conn.execute("SELECT pg_get_functiondef(%s::regproc)", (name,))
        if f"{_HEAD_FENCE} AND false" in definition:
            return
        if definition.count(_HEAD_FENCE) != 1:
            raise RuntimeError(f"mutation cannot find {_HEAD_FENCE!r} in {name}: update it")
        conn.execute(definition.replace(_HEAD_FENCE, f"{_HEAD_FENCE} AND false"))


def refence_group_heads(conn: Any) -> None:
    """Put the head fence back in the relay trigger's function of `conn`'s schema (its
    search_path): a simulation process's schema serves its next worlds, which must not inherit
    a mutated world's trigger."""
    [(definition,)] = conn.execute("SELECT pg_get_functiondef('oncebox_jobs_relay'::regproc)")
    if f"{_HEAD_FENCE} AND false" in definition:
        conn.execute(definition.replace(f"{_HEAD_FENCE} AND false", _HEAD_FENCE))


def _no_group_head_fence() -> None:
    from oncebox.store.postgres import PostgresStore  # noqa: PLC0415

    opened = PostgresStore.__init__

    def init(self: Any, url: str, **kwargs: Any) -> None:
        opened(self, url, **kwargs)
        unfence_group_heads(self)

    patch(PostgresStore, "__init__", init)


def _counted_give_back() -> None:
    from oncebox.brokers.transport import BrokerTransport  # noqa: PLC0415

    released = BrokerTransport.release

    def release(self: Any, deliveries: Any, delay: timedelta) -> None:
        if delay > timedelta(0):
            released(self, deliveries, delay)
            return
        for received in filter(None, map(self._take, deliveries)):
            self._quietly(self.queue.give_back, [received])

    def close(self: Any) -> None:
        self.queue.close()  # what its prefetch held returns with the connection, counted

    patch(BrokerTransport, "release", release)
    patch(BrokerTransport, "close", close)


def _ignore_window() -> None:
    from oncebox.lanes import delivery_rescuer, dispatcher  # noqa: PLC0415

    for module in (dispatcher, delivery_rescuer):
        patch(module, "past_window", lambda *_args: False)


def _unmatched_reports() -> None:
    from oncebox.deliveries import events  # noqa: PLC0415

    patch(events, "token_of", lambda _data: None)


def _resolver_ignores_reports() -> None:
    from oncebox.lanes.resolver import AmbiguityResolver  # noqa: PLC0415

    patch(AmbiguityResolver, "_unreported", lambda _self, _row: True)


def _no_lease_rescue() -> None:
    from oncebox.lanes.lease_rescuer import LeaseRescuer, LeaseRescuerResult  # noqa: PLC0415

    patch(LeaseRescuer, "run_once", lambda _self: LeaseRescuerResult([]))


def _release_refused_batch() -> None:
    from oncebox.lanes import consumer  # noqa: PLC0415

    class NeverRaised(Exception):
        """What the consumer now catches instead of StoreRefused: the refusal escapes."""

    patch(consumer, "StoreRefused", NeverRaised)


def _no_guard() -> None:
    from oncebox.lanes.consumer import Consumer  # noqa: PLC0415
    from oncebox.store import guard  # noqa: PLC0415
    from oncebox.store.sqlite import SqliteConsumerTx  # noqa: PLC0415

    patch(guard, "check_statement", lambda *_args, **_kwargs: None)
    patch(SqliteConsumerTx, "_deny_transaction_statements", lambda _self: lambda: None)
    patch(Consumer, "_after_broken_batch", _settle_by_claim)


def _settle_by_claim(self: Any, pending: list[Any], exc: Any, result: Any) -> list[Any]:
    """The recovery before the fix: the culprit is completed if its claim is in the database,
    and the rest of the batch runs again — where a claim of their own, committed by the
    culprit's COMMIT, settles them `completed` without their handler ever running."""
    from oncebox.lanes.consumer import ConsumerResult, describe_error  # noqa: PLC0415
    from oncebox.queue.transport import Settlement  # noqa: PLC0415

    culprit = exc.culprit
    outcome = ConsumerResult()
    with self.session.transaction() as tx:
        owners = tx.intent_owners([culprit.key]) if culprit.key else {}
        if culprit.key is not None and owners.get(culprit.key) == culprit.delivery.job_id:
            outcome.completed += 1
            settlement = Settlement.of(culprit.delivery, transitions.completed())
        else:
            settlement = self._dead(culprit, describe_error(exc.error), outcome)
        self.transport.settle_in_transaction(tx, [settlement])
    self.transport.after_commit([settlement])
    outcome.settled_ids = {culprit.delivery.message_id}
    result.add(outcome)
    return [d for d in pending if d.message_id != culprit.delivery.message_id]


def _bucket_time_back() -> None:
    from oncebox.lanes import dispatcher  # noqa: PLC0415
    from oncebox.outbox import ratelimit  # noqa: PLC0415

    original = ratelimit.take

    def take(buckets: Any, want: int, now: datetime, paused: datetime | None) -> Any:
        after, grant = original(buckets, want, now, paused)
        return [replace(bucket, updated_at=now) for bucket in after], grant

    patch(dispatcher, "take", take)


def _trigger_skips_stalled() -> None:
    from oncebox.runtime.trigger import ScheduleTrigger  # noqa: PLC0415

    patch(ScheduleTrigger, "_stalled", lambda _self, _schedule: [])


def _strand_on_outage() -> None:
    from oncebox.lanes.dispatcher import OutboxDispatcher  # noqa: PLC0415

    def forget(self: Any, _result: Any) -> None:
        self._open = {}  # the round's outcomes and unsent rows wait out their lease

    patch(OutboxDispatcher, "_recover", forget)


def _spend_on_outage() -> None:
    from oncebox.lanes.consumer import Consumer  # noqa: PLC0415

    def drop(self: Any, unsettled: list[Any], _result: Any) -> None:
        self.transport.drop(unsettled)  # every lease runs out: the rescuer spends every attempt

    patch(Consumer, "_strand", drop)


def _clock_never_lapses() -> None:
    from oncebox.kernel.clock import ClockLease  # noqa: PLC0415

    def write(self: Any) -> None:
        self.store.clock_set(self._setting)  # no expiry: it never lapses

    patch(ClockLease, "_write", write)


def _greedy_writer() -> None:
    from oncebox.lanes import consumer  # noqa: PLC0415
    from oncebox.store.sqlite_turns import WriterTurns  # noqa: PLC0415

    def begin(_self: Any, conn: Any, greedy: bool = False) -> None:
        conn.execute("BEGIN IMMEDIATE")  # SQLite's own busy handler, no turns

    patch(WriterTurns, "begin", begin)
    # longer than the scenario's busy timeout (2 s), so an enqueue waiting through one batch
    # fails whatever the machine's load; at 500 ms it only starved now and then
    patch(consumer, "SQLITE_BUDGET", timedelta(seconds=3))
    # and a batch too short to use that budget (a worker that keeps up, as after the wake-ups
    # by kind, leases a few jobs at a time) still keeps the lock past it once: the publishers
    # are at work by then, and one of them waits out its busy timeout
    held: list[bool] = []

    def hold(_name: str) -> None:
        if not held:
            held.append(True)
            clock.sleep(2.5)  # the fault itself: the lock kept, not a wait for anything

    points.install("consumer.after_handler_before_commit", hold)
    _UNDO.append(lambda: points.remove("consumer.after_handler_before_commit"))


def undo() -> None:
    """Put back what the switches replaced in this process."""
    while _PATCHED:
        module, name, value = _PATCHED.pop()
        setattr(module, name, value)
    while _UNDO:
        _UNDO.pop()()
    _APPLIED.clear()


def _install_ack_on_receipt() -> None:
    """Celery's default (`acks_late=False`): a job is done the moment it is received."""
    from oncebox.lanes import assembly  # noqa: PLC0415

    class AckOnReceipt(TableTransport):
        def fetch(self, limit: int) -> list[Delivery]:
            deliveries = super().fetch(limit)
            if deliveries:
                token = deliveries[0].lease_token or ""
                done = transitions.completed()
                finishes = [
                    JobFinish(id=d.job_id or 0, state=done.state, outcome=done.outcome)
                    for d in deliveries
                ]
                with self._session.transaction() as tx:
                    tx.job_finish(token, finishes)
            return deliveries

        def settle_in_transaction(self, tx: Any, settlements: Any) -> set[str]:
            return {s.delivery.message_id for s in settlements}

    patch(assembly, "TableTransport", AckOnReceipt)


def _rabbitmq_without_delivery_limit() -> None:
    from oncebox.brokers.rabbitmq.wire import RabbitQueue  # noqa: PLC0415

    declared = RabbitQueue._declare_main

    def declare(self: Any, arguments: dict[str, object]) -> None:
        # the topology before the fix: no limit of ours, dead letters straight to `.dead`
        before = {k: v for k, v in arguments.items() if k != "x-delivery-limit"}
        declared(self, {**before, "x-dead-letter-routing-key": f"{self.name}.dead"})

    patch(RabbitQueue, "_declare_main", declare)


PROCESS_WIDE = {
    "ack-before-commit": _install_ack_on_receipt,
    "ignore-window": _ignore_window,
    "unmatched-reports": _unmatched_reports,
    "stale-given-back": _stale_given_back,
    "resolver-ignores-reports": _resolver_ignores_reports,
    "no-lease-rescue": _no_lease_rescue,
    "release-refused-batch": _release_refused_batch,
    "no-guard": _no_guard,
    "bucket-time-back": _bucket_time_back,
    "trigger-skips-stalled": _trigger_skips_stalled,
    "strand-on-outage": _strand_on_outage,
    "spend-on-outage": _spend_on_outage,
    "clock-never-lapses": _clock_never_lapses,
    "greedy-writer": _greedy_writer,
    "aio-ignores-cancel": _aio_ignores_cancel,
    "no-group-head-fence": _no_group_head_fence,
    "counted-give-back": _counted_give_back,
    "rabbitmq-no-delivery-limit": _rabbitmq_without_delivery_limit,
}


def switch_on(names: tuple[str, ...]) -> None:
    """The process-wide switches of `names`, each once per process until `undo`."""
    for name in names:
        if name in PROCESS_WIDE and name not in _APPLIED:
            _APPLIED.add(name)
            PROCESS_WIDE[name]()

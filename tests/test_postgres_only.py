"""PostgreSQL-only behaviour: claims blocked by live transactions, aborted transactions,
concurrent ordered groups, LISTEN/NOTIFY. (On SQLite a consumer transaction holds the only write
lock, so a second claim can never be in flight; those paths do not exist there.)"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from oncebox import Box, ConsumerConfig, Retry, RetryLater, StoreUnavailable, WorkerConfig
from oncebox.chaos.mutations import mutated
from oncebox.lanes.lease_rescuer import LeaseRescuer, LeaseRescuerConfig
from oncebox.store.postgres import PostgresConsumerSession, PostgresStore, one_round_trip
from oncebox.testing import FrozenClock, drain
from support.db import create_effects, effects, record_effect, sql
from support.procs import hold_key_in_handler
from support.rows import job_attempts, job_row
from support.waiting import wait_until

pytestmark = pytest.mark.postgres
SPAWN = multiprocessing.get_context("spawn")
T0 = datetime(2026, 8, 17, 9, 0, tzinfo=UTC)


def _wait_backend_gone(url: str, pid: int) -> None:
    """Wait for a server backend to end (observed in pg_stat_activity, not assumed)."""
    with psycopg.connect(url, autocommit=True) as conn:

        def gone() -> bool:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
            return row.fetchone() == (0,)

        wait_until(gone, what=f"server backend {pid} to end")


@pytest.mark.slow
def test_a_claim_blocked_by_a_live_transaction_backs_off_and_completes_once_it_is_gone(pg_url):
    box = Box(pg_url)
    create_effects(box)

    @box.task(key="weekly-digest/customer-{customer_id}/{period}")
    def weekly_digest(ctx, customer_id: int, period: str) -> None:
        record_effect(ctx, "B")

    with FrozenClock(box, at=T0) as clock:
        held = box.enqueue(weekly_digest, customer_id=1, period="2026-W33").job_id
        inside, pids = SPAWN.Event(), SPAWN.Queue()
        worker_a = SPAWN.Process(target=hold_key_in_handler, args=(pg_url, inside, pids))
        worker_a.start()
        try:
            assert inside.wait(30), "worker A never reached its handler"
            a_backend = pids.get(timeout=10)
            # A's lease runs out while it still holds the uncommitted intent; B takes over.
            clock.advance(timedelta(minutes=10))
            rescued = LeaseRescuer(box.store, LeaseRescuerConfig(), box.metrics).run_once()
            assert [r.id for r in rescued.rescued] == [held]
            for customer in (2, 3):  # B's batch: the blocked key plus two free ones
                box.enqueue(weekly_digest, customer_id=customer, period="2026-W33")
            b = box.consumer(ConsumerConfig(lock_timeout=timedelta(milliseconds=200)), name="B")
            first = b.run_once()
            # B neither blocked forever nor failed the others: 2 done, the blocked one released
            assert (first.leased, first.completed, first.released) == (3, 2, 1)
            assert box.metrics.counter("claim_lock_timeouts") == 1
            row = job_row(box, held)
            assert (row.state, row.attempt) == ("ready", 1)  # the release spent no attempt
            assert row.run_at == T0 + timedelta(minutes=10, seconds=1)
            assert worker_a.pid is not None
            os.kill(worker_a.pid, signal.SIGKILL)
            worker_a.join(10)
            _wait_backend_gone(pg_url, a_backend)
            clock.advance(timedelta(seconds=1))
            second = b.run_once()
            b.session.close()
            assert (second.completed, second.duplicates) == (1, 0)
        finally:
            if worker_a.is_alive():
                worker_a.kill()
    assert sorted(effects(box)) == [
        ("weekly-digest/customer-1/2026-W33", "B"),
        ("weekly-digest/customer-2/2026-W33", "B"),
        ("weekly-digest/customer-3/2026-W33", "B"),
    ]
    attempts = job_attempts(box, held)
    assert [(a.attempt, a.outcome) for a in attempts] == [(1, "lease_expired")]
    assert job_row(box, held).attempt == 2
    box.close()


def test_a_handler_that_swallows_a_database_error_fails_its_attempt(pg_url):
    box = Box(pg_url)
    create_effects(box)

    @box.task(key="swallow/{n}", retry=Retry(max_attempts=1))
    def swallow(ctx, n: int) -> None:
        record_effect(ctx, "written before the error")
        with contextlib.suppress(psycopg.errors.DivisionByZero):
            ctx.connection.execute("SELECT 1/0")  # and carry on in an aborted transaction

    @box.task(key="fine/{n}")
    def fine(ctx, n: int) -> None:
        record_effect(ctx, "fine")

    box.enqueue(swallow, n=1)
    box.enqueue(fine, n=1)
    result = drain(box, raise_on_failure=False)
    assert (result.completed, result.dead) == (1, 1)
    assert "transaction aborted" in result.failures[0].error
    assert effects(box) == [("fine/1", "fine")]
    box.close()


@pytest.mark.slow
def test_concurrent_workers_never_overlap_jobs_of_one_group(pg_url):
    box = Box(pg_url)
    active: dict[str, int] = {}
    overlaps: list[str] = []
    order: dict[str, list[int]] = {}
    lock = threading.Lock()

    @box.task(key="leg/{customer}/{seq}", group_by="customer")
    def leg(ctx, customer: str, seq: int) -> None:
        with lock:
            if active.get(customer):
                overlaps.append(f"{customer}/{seq}")
            active[customer] = active.get(customer, 0) + 1
            order.setdefault(customer, []).append(seq)
        ctx.connection.execute("SELECT pg_sleep(0.002)")
        with lock:
            active[customer] -= 1

    for seq in range(15):
        for customer in ("c1", "c2", "c3"):
            box.enqueue(leg, customer=customer, seq=seq)
    box.work(
        config=WorkerConfig(concurrency=4, until_idle=True, consumer=ConsumerConfig(batch_size=2))
    )
    assert overlaps == []
    assert order == {c: list(range(15)) for c in ("c1", "c2", "c3")}
    box.close()


def test_a_heartbeat_skips_a_row_its_settlement_holds_instead_of_waiting_on_it(pg_url):
    """A settlement locks its batch's rows in its own order; a heartbeat that waited for one of
    them while holding others it had already extended would deadlock with it (seen with two
    consumer threads: one batch lost a second to deadlock detection and was retried)."""
    box = Box(pg_url)
    box.task(key="beat/{n}", name="beat")(lambda ctx, n: None)
    box.enqueue_many("beat", [{"n": 1}, {"n": 2}])
    consumer = box.consumer()
    deliveries = consumer.transport.fetch(2)
    token = deliveries[0].lease_token
    assert token is not None and len(deliveries) == 2
    settling = psycopg.connect(pg_url)
    extended: list[int] = []
    try:
        settling.execute(
            "UPDATE oncebox_jobs SET last_error = 'settling' WHERE id = %s",
            (deliveries[1].job_id,),
        )  # the settlement's row lock, its transaction still open
        beat = threading.Thread(
            target=lambda: extended.append(
                box.store.job_lease_extend([token], timedelta(seconds=30))
            )
        )
        beat.start()
        beat.join(10)
        assert not beat.is_alive(), "the heartbeat waited on a row its settlement holds"
        assert extended == [1]
    finally:
        settling.rollback()
        settling.close()
    assert box.store.job_lease_extend([token], timedelta(seconds=30)) == 2
    consumer.session.close()
    box.close()


def test_tables_can_live_in_a_schema_of_the_users_choice(pg_url):
    url = f"{pg_url}?schema=jobs_here"
    from oncebox.store import open_store

    open_store(url, migrate=True).close()
    box = Box(url)

    @box.task(key="s/{n}")
    def task(ctx, n: int) -> None:
        pass

    box.enqueue(task, n=1)
    assert drain(box).completed == 1
    tables = sql(
        box,
        "SELECT table_schema FROM information_schema.tables WHERE table_name = "
        "'oncebox_intents' ORDER BY 1",
    )
    assert tables == [("jobs_here",), ("public",)]
    assert sql(box, "SELECT count(*) FROM jobs_here.oncebox_intents") == [(1,)]
    assert sql(box, "SELECT count(*) FROM public.oncebox_intents") == [(0,)]
    box.close()


def test_retry_later_is_measured_on_the_database_clock(pg_url):
    box = Box(pg_url)

    @box.task(key="r/{n}")
    def later(ctx, n: int) -> None:
        raise RetryLater(delay=timedelta(seconds=90))

    with FrozenClock(box, at=T0):
        job = box.enqueue(later, n=1).job_id
        drain(box, raise_on_failure=False)
        assert job_row(box, job).run_at == T0 + timedelta(seconds=90)
    box.close()


def test_a_consumer_survives_its_connection_being_terminated(pg_url):
    box = Box(pg_url)

    @box.task(key="k/{n}")
    def task(ctx, n: int) -> None:
        pass

    box.enqueue(task, n=1)
    consumer = box.consumer(name="victim")
    try:
        assert consumer.run_once().completed == 1
        killed = sql(
            box,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name LIKE 'oncebox %:victim'",
        )
        assert killed == [(True,)]
        box.enqueue(task, n=2)
        with pytest.raises(StoreUnavailable):
            consumer.run_once()  # the loss surfaces once...
        assert consumer.run_once().completed == 1  # ...and the next round reconnects
    finally:
        consumer.session.close()
        box.close()


@pytest.mark.slow
def test_the_server_ends_a_hung_handlers_transaction_and_releases_its_claim(pg_url):
    from oncebox.queue.watch import HandlerWatch

    box = Box(pg_url)
    create_effects(box)
    inside, proceed = threading.Event(), threading.Event()

    @box.task(key="hung/{n}", timeout=0.3)
    def hung(ctx, n: int) -> None:
        record_effect(ctx, "uncommitted")  # holds the intent and this row, uncommitted
        inside.set()
        proceed.wait(20)
        ctx.connection.execute("SELECT 1")

    box.enqueue(hung, n=1)
    watch = HandlerWatch(grace=timedelta(seconds=0.2), exit_on_hang=False)
    consumer = box.consumer(watch=watch, name="hung")
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            consumer.run_once()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert inside.wait(10)
        query = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'oncebox %:hung'"
        wait_until(lambda: sql(box, query) == [(0,)], what="the server to end the hung transaction")
        # its claim is gone with it: another transaction can take the key at once
        assert box.store.intent_get("hung/1") is None
    finally:
        proceed.set()
        thread.join(20)
        consumer.session.close()
    assert isinstance(outcome.get("error"), StoreUnavailable)
    assert effects(box) == []
    # not released for free: the lease runs out and the rescuer will count the attempt
    assert box.find("hung/1")[0].state == "leased"
    assert consumer.transport.held_tokens() == []
    box.close()


def _confirm_hold(
    box,
    hold_id: int,
    before_commit: threading.Event | None = None,
    reached: threading.Event | None = None,
) -> bool:
    """The booking app's confirm: a guarded transition plus, if it won, its own keyed notice."""
    with psycopg.connect(box.store.conninfo) as conn:
        won = (
            conn.execute(
                "UPDATE holds SET state = 'confirmed' WHERE id = %s AND state = 'held' "
                "RETURNING id",
                (hold_id,),
            ).fetchone()
            is not None
        )
        if won:
            box.enqueue("confirm_notice", hold_id=hold_id, connection=conn)
        if reached is not None:
            reached.set()
        if before_commit is not None:
            before_commit.wait(20)
        conn.commit()
    return won


def _race_box(pg_url):
    from support.holds import holds_box

    box = holds_box(pg_url)

    @box.task(key="hold-confirmed/hold-{hold_id}")
    def confirm_notice(ctx, hold_id: int) -> None:
        pass

    return box


@pytest.mark.slow
def test_confirm_versus_expire_when_the_sweeper_locks_first_ends_expired_with_one_notice(pg_url):
    from oncebox.kernel import points
    from support.holds import add_hold, hold_states

    box = _race_box(pg_url)
    pause = points.Pause(only=lambda thread: thread == "sweeper", timeout=20)
    outcome: dict[str, bool] = {}
    with (
        FrozenClock(box, at=T0),
        points.installed({"sweeper.after_transition_before_commit": pause}),
    ):
        add_hold(box, 1, T0 - timedelta(seconds=1))
        sweeper = box.expiry_sweeper("hold-expiry")
        sweeping = threading.Thread(target=sweeper.run_once, name="sweeper")
        sweeping.start()
        assert pause.reached.wait(10)
        confirming = threading.Thread(target=lambda: outcome.update(won=_confirm_hold(box, 1)))
        confirming.start()
        wait_until(
            lambda: sql(box, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"),
            what="the confirm to wait on the hold's lock",
        )
        pause.release()
        sweeping.join(10)
        confirming.join(10)
        sweeper.close()
    assert outcome == {"won": False}
    assert hold_states(box) == {1: "expired"}
    assert [r.key for r in box.store.outbox_find_by_key("hold-expired/hold-1")] == [
        "hold-expired/hold-1"
    ]
    assert box.store.job_find_by_key("hold-confirmed/hold-1") == []
    box.close()


def test_confirm_versus_expire_when_the_confirm_locks_first_ends_confirmed_without_notice(pg_url):
    from support.holds import add_hold, hold_states

    box = _race_box(pg_url)
    with FrozenClock(box, at=T0):
        add_hold(box, 1, T0 - timedelta(seconds=1))
        release, reached = threading.Event(), threading.Event()
        outcome: dict[str, bool] = {}
        confirming = threading.Thread(
            target=lambda: outcome.update(
                won=_confirm_hold(box, 1, before_commit=release, reached=reached)
            )
        )
        confirming.start()
        assert reached.wait(10)  # its transaction holds the hold's row, uncommitted
        sweeper = box.expiry_sweeper("hold-expiry")
        assert sweeper.run_once().handled == 0  # SKIP LOCKED: the confirming hold is passed by
        sweeper.close()
        release.set()
        confirming.join(10)
    assert outcome == {"won": True}
    assert hold_states(box) == {1: "confirmed"}
    assert box.store.outbox_find_by_key("hold-expired/hold-1") == []
    assert [j.key for j in box.store.job_find_by_key("hold-confirmed/hold-1")] == [
        "hold-confirmed/hold-1"
    ]
    box.close()


@pytest.mark.slow
def test_a_lease_right_after_a_bulk_enqueue_walks_the_claim_index_instead_of_sorting(pg_url):
    """Right after a bulk enqueue the table's statistics say it has no ready jobs; left to
    itself the planner then collects every ready job and sorts them, per lease — O(backlog).
    The lease must read the claim index in order and stop at its limit, whatever the
    statistics say (here: never analyzed)."""
    box = Box(pg_url)

    @box.task(key="bulk/{n}")
    def bulk(ctx, n: int) -> None:
        pass

    box.enqueue_many("bulk", [{"n": n} for n in range(20_000)])
    # a fixed lease of 1000 (the adaptive size would grow it: see tests/test_lease_size.py)
    consumer = box.consumer(ConsumerConfig(batch_size=1000, max_batch_size=1000))
    plans: list[str] = []
    try:
        for _ in range(10):  # a queue in the middle of its backlog: half done, half ready
            assert consumer.run_once().completed == 1000
        assert isinstance(consumer.session, PostgresConsumerSession)
        conn = consumer.session._conn
        superuser = "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        if conn.execute(superuser).fetchone() != (True,):
            pytest.skip("auto_explain needs a superuser to LOAD it")
        conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        conn.execute("SET auto_explain.log_min_duration = 0")
        conn.execute("SET auto_explain.log_level = 'notice'")
        assert consumer.run_once().completed == 1000
    finally:
        consumer.session.close()
        box.close()
    lease = [p for p in plans if "picked AS" in p]
    assert lease, f"no lease plan was logged: {plans}"
    assert "Sort" not in lease[0], lease[0]
    assert "Index Scan using oncebox_jobs_claim" in lease[0], lease[0]
    # the settlement finds its jobs by primary key, not through the leased index, which keeps
    # an entry for every lease ever taken until a vacuum (here: 11 000)
    settle = [p for p in plans if "settled AS" in p]
    assert settle, f"no settlement plan was logged: {plans}"
    assert "oncebox_jobs_pkey" in settle[0] and "oncebox_jobs_leased" not in settle[0], settle[0]


def test_an_idle_poll_reads_the_next_due_time_in_the_leases_own_transaction(pg_url):
    """Idle on PostgreSQL, a consumer's poll is one transaction: the lease that finds nothing
    also reads when the next job falls due (a retry, a delayed job), so the wait is computed
    without asking the store again."""
    box = Box(pg_url)

    @box.task(key="later/{n}")
    def later(ctx, n: int) -> None:
        pass

    box.enqueue(later, n=1, delay=timedelta(seconds=60))
    consumer = box.consumer()
    asked: list[object] = []
    consumer.transport._next_due = lambda *args: asked.append(args)  # type: ignore[attr-defined]  # spy
    try:
        assert consumer.run_once().leased == 0
        due_in = consumer.transport.next_due_in()
    finally:
        consumer.session.close()
        box.close()
    assert asked == []
    assert due_in is not None and 50 < due_in <= 60


@pytest.mark.slow
def test_an_outbox_lease_reads_each_channels_head_not_the_whole_backlog(pg_url):
    """A fan-out writes a million outbox rows at once; a dispatcher's lease must read its
    limit's worth from the due index, not every due row (sorted, per lease: O(backlog))."""
    import re

    from oncebox.lanes.dispatcher import DispatcherConfig

    writer = Box(pg_url, secret="s" * 32)
    writer.channel("email", provider="null:")

    @writer.task(key="mail/{n}")
    def mail(ctx, n: int) -> None:
        ctx.outbox.email(to=f"c{n}@example.com", subject="digest", text="hello")

    writer.enqueue_many("mail", [{"n": n} for n in range(3000)])
    writer.work(config=WorkerConfig(until_idle=True, dispatch=False))
    writer.close()
    box = Box(pg_url + "?pool_min=1&pool_max=1", secret="s" * 32)  # one pooled connection
    box.channel("email", provider="null:")
    box.task(key="mail/{n}", name="mail")(lambda ctx, n: None)
    plans: list[str] = []
    try:
        assert isinstance(box.store, PostgresStore)
        with box.store.pool().connection() as conn:
            superuser = "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
            if conn.execute(superuser).fetchone() != (True,):
                pytest.skip("auto_explain needs a superuser to LOAD it")
            conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
            for statement in [
                "LOAD 'auto_explain'",
                "SET auto_explain.log_min_duration = 0",
                "SET auto_explain.log_analyze = on",
                "SET auto_explain.log_level = 'notice'",
            ]:
                conn.execute(statement.encode())
        assert box.dispatcher(DispatcherConfig(batch_size=50)).run_once().sent == 50
    finally:
        box.close()
    text = "\n".join(plans)
    scans = re.findall(r"Index Scan using oncebox_outbox_due .*?actual time=\S+ rows=(\d+)", text)
    assert scans, f"no plan read the due index: {text[:3000]}"
    assert all(int(rows) <= 50 for rows in scans), scans
    # the receipts do not go through the leased index (an entry for every lease ever taken,
    # until a vacuum); on a table this small the planner may as well scan it
    settle = [p for p in plans if "settled AS" in p]
    assert settle, f"no settlement plan was logged: {text[:3000]}"
    assert "oncebox_outbox_leased" not in settle[0], settle[0]


def round_trips_of_one_batch(box: Box, tmp_path: Path) -> list[str]:
    """libpq's trace of a consumer lane's connection over one `run_once`, cut at each
    ReadyForQuery: what went to the server and back in each round trip."""
    consumer = box.consumer()
    trace = tmp_path / "libpq.trace"
    conn = consumer.session._conn  # type: ignore[attr-defined]  # the lane's own connection
    try:
        with trace.open("w") as out:
            conn.pgconn.trace(out.fileno())
            conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
            try:
                consumer.run_once()
            finally:
                conn.pgconn.untrace()
    finally:
        consumer.session.close()
    return trace.read_text().split("ReadyForQuery")


def test_a_lease_is_one_round_trip_with_its_begin_settings_and_commit(pg_url, tmp_path):
    """The lease's transaction (its settings, the lease, the look at the next due time) goes to
    the server and back once: psycopg's transaction block inside a pipeline synced twice."""
    box = Box(pg_url)

    @box.task(key="step/{n}")
    def step(ctx, n: int) -> None:
        pass

    box.enqueue(step, n=1)
    round_trips = round_trips_of_one_batch(box, tmp_path)
    box.close()
    lease = [text for text in round_trips if "leased_by = " in text]
    assert len(lease) == 1
    assert '"BEGIN"' in lease[0] and "set_config" in lease[0] and '"COMMIT"' in lease[0]


def test_a_consumer_transactions_begin_travels_with_its_claim(pg_url, tmp_path):
    """The BEGIN of a consumer transaction is no round trip of its own: it reaches the server in
    one pipeline with the claim."""
    box = Box(pg_url)
    create_effects(box)

    @box.task(key="step/{n}")
    def step(ctx, n: int) -> None:
        record_effect(ctx, f"step {n}")

    box.enqueue(step, n=1)
    round_trips = round_trips_of_one_batch(box, tmp_path)
    claim = [text for text in round_trips if "oncebox_intents" in text and "INSERT" in text]
    assert len(claim) == 1 and '"BEGIN"' in claim[0]
    assert [row[0] for row in effects(box)] == ["step/1"]  # and the batch committed
    box.close()


def test_a_round_trip_that_fails_leaves_its_connection_out_of_any_transaction(pg_url):
    """A statement of a lease's round trip that fails makes the server skip the rest, COMMIT
    included: the transaction left behind is rolled back before the error goes on, so the lane's
    next lease (or the pool's next borrower) does not meet "current transaction is aborted"."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero), one_round_trip(conn):
            conn.execute("SELECT 1")
            conn.execute("SELECT 1 / 0")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert conn.execute("SELECT 2").fetchone() == (2,)


def _prune_while_a_record_is_taken_over(pg_url: str) -> tuple[list[int], list[tuple[str]]]:
    """A request takes over an expired Idempotency-Key record while the prune, which read it
    expired, waits on its lock: what the prune deleted, and the claims left."""
    from oncebox.store.records import ApiRequestClaim

    box = Box(pg_url, seed=1)
    store = box.store
    key = store.api_key_insert("billing", "enqueue", "a" * 64, "20/s", "ops")
    assert key is not None
    retain, stale = timedelta(hours=24), timedelta(minutes=1)
    with FrozenClock(box, at=T0) as clock:
        assert store.api_request_claim(
            ApiRequestClaim(key.id, "order-7", "fp", "first", retain, stale)
        )
        clock.advance(retain + timedelta(seconds=1))  # expired: the prune's to take
        assert isinstance(store, PostgresStore)
        with store.connect() as taker:  # a request takes the expired record over, not committed
            taker.execute(
                "UPDATE oncebox_api_requests SET claim = 'second', expires_at = %s "
                "WHERE idempotency_key = 'order-7'",
                (T0 + 2 * retain,),
            )
            pruned: list[int] = []
            pruning = threading.Thread(target=lambda: pruned.append(store.api_request_prune(10)))
            pruning.start()
            wait_until(
                lambda: sql(box, "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"),
                what="the prune to wait on the record's lock",
            )
            taker.commit()
        pruning.join(10)
    kept = sql(box, "SELECT claim FROM oncebox_api_requests WHERE idempotency_key = 'order-7'")
    box.close()
    return pruned, kept


def test_a_prune_spares_an_idempotency_record_taken_over_while_it_waited(pg_url):
    """The prune picks expired records in a subquery, then deletes them: a record a request took
    over meanwhile (no longer expired) is spared — the delete rechecks the expiry on the row it
    locks, a compare-and-set, not the subquery's older reading."""
    assert _prune_while_a_record_is_taken_over(pg_url) == ([0], [("second",)])


def test_a_prune_without_its_fence_deletes_a_record_taken_over(pg_url):
    with mutated("prune-taken-over"):
        assert _prune_while_a_record_is_taken_over(pg_url) == ([1], [])

"""Switches that break a guarantee on purpose, to prove the harness notices.

A checker that never fails proves nothing. Each mutation removes one mechanism oncebox's
guarantee rests on, in every process of a run, and names the scenario that must then fail:

    no-lease-fence     settlements and the send marker stop checking the lease token
                       → `slow-consumer-past-lease` fails (a superseded worker commits)
    ack-before-commit  a job is acknowledged (done) when leased, before its transaction commits
                       → `kill-consumer.after_claim_insert` fails (the digest is lost)
    no-unique-index    the claim is a plain insert and the intents table loses its primary key
                       → `concurrent-consumers` fails (two intents for one key)
    period-%Y          the weekly period is formatted with %Y (calendar year) instead of the
                       ISO year → `iso-week-boundary` fails (a wrong, colliding period)
    no-lease-rescue    the lease rescuer does nothing: leases of dead processes are never freed
                       → `real-clock-crashes` fails (L3: keys not visible within the bound)
    release-refused-batch  a batch the database refuses at COMMIT is given back whole with its
                       attempts undone (the fix reverted) → `commit-refused` fails (L1)
    no-guard           the handler guard lets transaction control through, and recovery settles
                       a batch by its claims alone (both fixes reverted) → `guard-bypass` fails
                       (S3, L2: jobs done without their digest)
    bucket-time-back   a rate-limit taker writes its earlier clock back into the bucket (the fix
                       reverted) → `rate-limit-contention` fails (R1: more sends than the rate)
    no-resume          the scheduler never resumes a stalled fan-out → `scheduler-replaced-after-
                       next-fire` fails (S4, L2: the interrupted week's other customers)
    trigger-skips-stalled  a schedule's trigger never reads its stalled runs (only the ticker
                       resumes them) → `test_a_trigger_without_its_resume_loses_a_dead_fan_outs_
                       period` fails (cron-only: the dead fan-out's other customers are lost)
    take-over-unfenced an operator's take-over of a fan-out stops checking that the run is as it
                       was read → `test_a_take_over_without_its_fence_takes_a_live_owners_run`
                       fails (an owner that renewed meanwhile loses its run)
    strand-on-outage   a dispatcher forgets its round when the store goes away (the fix
                       reverted) → `store-outage-dispatch` fails (L3: rows wait out the lease)
    clock-never-lapses a test clock is held without an expiry → `clock-holder-killed` fails (L3:
                       workers refuse the dead owner's clock)
    greedy-writer      SQLite writers race for the lock as before turns, and the consumer keeps
                       it up to 3 s (its first batch 2.5 s however short), past the publishers'
                       2 s busy timeout → `sqlite-writer-contention` fails (E1: enqueues time
                       out) however loaded the machine
    new-token-on-replay  a redriven message gets a new token (a new idempotency key): the
                       replay-under-a-new-key bug → `redrive-after-hours` fails (S11: the provider
                       takes tokens of no eligible key; L2: the keys' own tokens never arrive)
    ignore-window      the provider's idempotency window is never past: an unknown outcome is
                       resent under the same key however late → `resend-past-window` fails
                       (S5: the provider had forgotten the key and delivers a second copy)
    unmatched-reports  a provider's delivery event no longer finds its message (the token every
                       send carries is not read) → `lost-acks-reported` fails (H1: held sends
                       stay held although the provider reported each one taken)
    prune-taken-over   the Idempotency-Key records' prune no longer rechecks the expiry of the
                       rows it deletes → a test fails: a record a request took over while the
                       prune waited is deleted under it
    stale-given-back   a broker consumer gives a stale copy (its job moved on) back to the queue
                       instead of acknowledging it → `broker-kill-consumer.committed` fails (B1:
                       the copies a lost acknowledgement left stay in RabbitMQ)
    aio-ignores-cancel a cancelled `box.aio` call on the caller's connection goes on in its thread
                       (the fix reverted) → `test_a_cancelled_enqueue_goes_on_without_its_check`
                       (tests/test_aio.py) fails: a statement after the caller's rollback, its
                       job committed by the caller's next transaction
    idempotency-fixed-takeover  an Idempotency-Key record is taken over 60 s after its request
                       started, whether or not its holder still renews it (the fix reverted) →
                       `test_an_idempotency_key_is_taken_from_a_holder_at_work_without_its_fence`
                       (tests/test_api_served.py) fails: a second run beside the first, whose
                       answer is then not the one kept
    spend-on-outage    a consumer whose batch a store outage cut short leaves every lease to run
                       out (the give-back reverted) → `tests/test_consumer_outage.py::test_a_batch_
                       the_store_went_away_under_spends_every_attempt_without_its_give_back`
                       fails (jobs that never ran lose an attempt)
    unfenced-give-back a give-back (`job_release`) no longer checks the lease token and attempt →
                       `tests/test_consumer_outage.py::test_a_give_back_without_its_fence_takes_
                       the_jobs_from_their_new_holder` fails (a consumer back from an outage
                       takes the jobs another consumer leased after the rescue)
    resolver-ignores-reports  the resolver judges a held send without its provider's events,
                       nor does its write check them → a send reported `failed` is replayed under
                       its key and recorded sent (tests/test_resolver_fences.py)
    resolver-stale-attempt  the resolver's write no longer checks the hold it judged (its attempt
                       and the delivery attempt that held it) → a resolver working from a stale
                       page resends the row's next hold at once: a third copy
                       (tests/test_resolver_fences.py)
    resolver-report-race  the resolver's write no longer checks that no event names the row →
                       an event recorded between its check and its write is resent over
                       (tests/test_resolver_fences.py)

    unlimit-any-task   a worker un-limits the ready jobs of every task its code declares without
                       limits, whatever another release declares → `tests/test_task_limits.py::
                       test_an_old_release_strips_and_runs_a_new_releases_limited_jobs_without_
                       its_fence` (a rolling deploy's old workers run the new limit's jobs)
    spend-picks        a limited lease spends its rates' tokens on the jobs it chose, not on
                       those it leased → `tests/test_task_limits.py::test_a_limited_lease_spends_
                       tokens_on_a_job_it_skipped_without_its_fence` (PostgreSQL: a row another
                       transaction holds drains the bucket while nothing runs)
    no-group-head-fence  the relay trigger publishes a group's job whenever no earlier job of
                       its group waits, though another is the head already (the fence reverted;
                       PostgreSQL: the trigger is rewritten in each database a store opens) →
                       `tests/test_relay_group_heads.py::test_a_group_has_two_heads_without_its_fence`
                       (a batch's job decided after a later enqueue's: two heads)
    rabbitmq-no-delivery-limit  a RabbitMQ queue is declared as before the fix, without
                       `x-delivery-limit` → `tests/test_rabbitmq.py::test_a_message_no_one_
                       settles_is_delivered_for_ever_without_the_delivery_limit` fails (a
                       message no one settles is delivered again, never set aside)
    counted-give-back  a broker consumer gives back what it releases unrun, and closes on what
                       its prefetch holds, as failed deliveries its broker counts (the fix
                       reverted) → `tests/test_given_up.py::test_a_worker_stopping_buries_jobs_
                       that_never_ran_without_the_hand_back` (jobs that never ran buried dead)

They exist only for the harness's own tests (`oncebox chaos --mutation NAME`); nothing else can
switch them on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from oncebox.chaos import switches
from oncebox.jobs.periods import PeriodKind, iso_week
from oncebox.kernel.errors import ConfigurationError


@dataclass(frozen=True)
class Mutation:
    name: str
    breaks: str
    # what must fail with it: a chaos scenario, or a test (`tests/<file>.py::<test>`) that runs
    # the race it opens deterministically under `mutated(name)` and asserts its harm
    must_fail: str
    stores: tuple[str, ...] = ("sqlite", "postgres")  # where that must fail with it

    @property
    def caught_by_test(self) -> bool:
        return "::" in self.must_fail


_RESOLVER_TESTS = "tests/test_resolver_fences.py::"
MUTATIONS = {
    m.name: m
    for m in (
        Mutation("no-lease-fence", "the lease-token fence", "slow-consumer-past-lease"),
        Mutation(
            "ack-before-commit", "acknowledgement after commit", "kill-consumer.after_claim_insert"
        ),
        Mutation("no-unique-index", "the unique claim", "concurrent-consumers"),
        Mutation("period-%Y", "ISO-year periods", "iso-week-boundary"),
        Mutation("new-token-on-replay", "replay under the same key", "redrive-after-hours"),
        Mutation("no-lease-rescue", "the lease rescuer", "real-clock-crashes"),
        Mutation("release-refused-batch", "commit-time refusals", "commit-refused"),
        Mutation("no-guard", "the handler guard and its recovery", "guard-bypass"),
        # SQLite reads the bucket's time under its write lock: it never had the bug
        Mutation(
            "bucket-time-back", "monotonic bucket time", "rate-limit-contention", ("postgres",)
        ),
        Mutation("no-resume", "resuming stalled fan-outs", "scheduler-replaced-after-next-fire"),
        Mutation(
            "trigger-skips-stalled",
            "a trigger resuming stalled fan-outs",
            "tests/store_contract/test_schedule_trigger.py::"
            "test_a_trigger_without_its_resume_loses_a_dead_fan_outs_period",
        ),
        Mutation(
            "take-over-unfenced",
            "the take-over's fence on the run as read",
            "tests/store_contract/test_schedule_take_over.py::"
            "test_a_take_over_without_its_fence_takes_a_live_owners_run",
        ),
        Mutation("strand-on-outage", "recovery after a store outage", "store-outage-dispatch"),
        Mutation("clock-never-lapses", "the test clock's lease", "clock-holder-killed"),
        Mutation("greedy-writer", "SQLite write turns", "sqlite-writer-contention", ("sqlite",)),
        Mutation("ignore-window", "the idempotency window", "resend-past-window"),
        Mutation(
            "unmatched-reports", "the token provider events are matched by", "lost-acks-reported"
        ),
        Mutation(
            "prune-taken-over",
            "the prune's recheck of an Idempotency-Key record's expiry",
            "tests/test_postgres_only.py::test_a_prune_without_its_fence_deletes_a_record_taken_over",
            ("postgres",),
        ),
        Mutation(
            "stale-given-back",
            "acknowledging stale broker copies",
            "broker-kill-consumer.committed",
            ("postgres",),
        ),
        # SQLite has no async caller connection (box.aio takes sqlite3 only through the sync API)
        Mutation(
            "aio-ignores-cancel",
            "stopping a cancelled call on the caller's connection",
            "tests/test_aio.py::test_a_cancelled_enqueue_goes_on_without_its_check",
            ("postgres",),
        ),
        Mutation(
            "idempotency-fixed-takeover",
            "an Idempotency-Key kept while its holder renews it",
            "tests/test_api_served.py::"
            "test_an_idempotency_key_is_taken_from_a_holder_at_work_without_its_fence",
        ),
        Mutation(
            "spend-on-outage",
            "giving back a batch a store outage cut short",
            "tests/test_consumer_outage.py::"
            "test_a_batch_the_store_went_away_under_spends_every_attempt_without_its_give_back",
        ),
        Mutation(
            "unfenced-give-back",
            "the give-back's lease token and attempt fence",
            "tests/test_consumer_outage.py::"
            "test_a_give_back_without_its_fence_takes_the_jobs_from_their_new_holder",
        ),
        Mutation(
            "resolver-ignores-reports",
            "held sends a provider event names stay for a person",
            _RESOLVER_TESTS + "test_a_send_reported_failed_is_settled_sent_without_its_fence",
        ),
        Mutation(
            "resolver-stale-attempt",
            "the resolver's fence on the hold it judged",
            _RESOLVER_TESTS
            + "test_a_resolver_working_from_a_stale_page_sends_a_third_copy_without_its_fence",
        ),
        Mutation(
            "resolver-report-race",
            "the resolver's fence on no event naming the row",
            _RESOLVER_TESTS
            + "test_a_report_recorded_after_the_resolvers_check_is_resent_over_without_its_fence",
        ),
        Mutation(
            "unlimit-any-task",
            "un-limiting only what no process declares limited",
            "tests/test_task_limits.py::"
            "test_an_old_release_strips_and_runs_a_new_releases_limited_jobs_without_its_fence",
        ),
        # SQLite's lease holds the write lock from its choice on: it skips nothing it chose
        Mutation(
            "spend-picks",
            "spending only what a limited lease leased",
            "tests/test_task_limits.py::"
            "test_a_limited_lease_spends_tokens_on_a_job_it_skipped_without_its_fence",
        ),
        Mutation(
            "rabbitmq-no-delivery-limit",
            "RabbitMQ setting a message aside after max_deliveries",
            "tests/test_rabbitmq.py::"
            "test_a_message_no_one_settles_is_delivered_for_ever_without_the_delivery_limit",
            ("postgres",),
        ),
        Mutation(
            "counted-give-back",
            "handing back unrun deliveries uncounted",
            "tests/test_given_up.py::"
            "test_a_worker_stopping_buries_jobs_that_never_ran_without_the_hand_back",
            ("postgres",),
        ),
        Mutation(
            "no-group-head-fence",
            "one head per group in the broker",
            "tests/test_relay_group_heads.py::test_a_group_has_two_heads_without_its_fence",
            ("postgres",),
        ),
    )
}
# Query rewrites per dialect: (query name, text that must be there, what replaces it). A rewrite
# whose text is missing is an error, so a refactor cannot silently turn a mutation into a no-op.
Rewrite = tuple[str, str, str]  # (query name, text that must be there, what replaces it)
_FENCES: dict[str, tuple[Rewrite, ...]] = {
    "postgres": (
        (
            "job_finish",
            "j.id = i.id AND j.lease_token = %(token)s",
            "j.id = i.id AND j.state = 'leased'",
        ),
        ("outbox_mark_sending", "lease_token = %(token)s AND ", ""),
        (
            "outbox_finish",
            "o.id = i.id AND o.lease_token = %(token)s",
            "o.id = i.id AND o.state IN ('leased', 'sending')",
        ),
    ),
    "sqlite": (
        ("job_finish", "j.lease_token = :token AND ", ""),
        ("outbox_mark_sending", "lease_token = :token AND ", ""),
        ("outbox_finish", "o.lease_token = :token AND ", ""),
    ),
}
# The resolver's write without its "no event names the row" condition.
_NO_REPORT_FENCE: dict[str, tuple[Rewrite, ...]] = {
    "postgres": (
        ("outbox_resolve", "\n               AND o.events = 0 AND o.reported IS NULL", ""),
    ),
    "sqlite": (("outbox_resolve", "\n           AND events = 0 AND reported IS NULL", ""),),
}
# The mutations that rewrite queries, per dialect.
_QUERY_REWRITES: dict[str, dict[str, tuple[Rewrite, ...]]] = {
    "no-lease-fence": _FENCES,
    "no-unique-index": {
        "postgres": (("intent_claim", "ON CONFLICT (key) DO NOTHING", ""),),
        "sqlite": (("intent_claim", "ON CONFLICT (key) DO NOTHING", ""),),
    },
    "new-token-on-replay": {
        "postgres": (
            ("outbox_replay", "rescues = 0\n", "rescues = 0, token = o.token || '-again'\n"),
        ),
        "sqlite": (("outbox_replay", "rescues = 0\n", "rescues = 0, token = token || '-again'\n"),),
    },
    "prune-taken-over": {
        "postgres": (
            (
                "api_request_prune",
                "LIMIT %(limit)s)\n  AND expires_at <= (SELECT now FROM clock)",
                "LIMIT %(limit)s)",
            ),
        ),
    },
    "unlimit-any-task": {
        "postgres": (("job_unlimit", "WHERE d.task = t.task", "WHERE false AND d.task = t.task"),),
        "sqlite": (("job_unlimit", "WHERE d.task = t.value", "WHERE false AND d.task = t.value"),),
    },
    "spend-picks": {
        "postgres": (("limit_spend", "AND j.state = 'leased' AND j.lease_token = %(token)s", ""),),
        "sqlite": (("limit_spend", "WHERE j.state = 'leased' AND j.lease_token = :token", ""),),
    },
    "take-over-unfenced": {
        "postgres": (
            (
                "schedule_run_take_over",
                "      AND r.owner = %(seen_owner)s"
                " AND r.lease_expires_at = %(seen_lease)s::timestamptz\n"
                "      AND r.renewed_at IS NOT DISTINCT FROM %(seen_renewed)s::timestamptz\n",
                "",
            ),
        ),
        "sqlite": (
            (
                "schedule_run_take_over",
                "  AND owner = :seen_owner AND lease_expires_at = :seen_lease\n"
                "  AND renewed_at IS :seen_renewed\n",
                "",
            ),
        ),
    },
    "no-resume": {
        "postgres": (("schedule_run_stalled", "state = 'running'", "state = 'never'"),),
        "sqlite": (("schedule_run_stalled", "state = 'running'", "state = 'never'"),),
    },
    "idempotency-fixed-takeover": {
        "postgres": (
            (
                "api_request_claim",
                "coalesce(r.held_until, r.started_at + interval '60 seconds')",
                "(r.started_at + interval '60 seconds')",
            ),
        ),
        "sqlite": (
            (
                "api_request_claim",
                "coalesce(r.held_until, r.started_at + 60000000)",
                "(r.started_at + 60000000)",
            ),
        ),
    },
    "unfenced-give-back": {
        "postgres": (
            ("job_release", "j.lease_token = %(token)s AND j.attempt = g.attempt AND ", ""),
        ),
        "sqlite": (
            ("job_release", "j.lease_token = :token AND j.attempt = g.value ->> 1\n  AND ", ""),
        ),
    },
    "resolver-ignores-reports": _NO_REPORT_FENCE,
    "resolver-stale-attempt": {
        "postgres": (
            ("outbox_resolve", "o.attempt = %(seen_attempt)s::int\n", "true\n"),
            ("outbox_resolve", "IS NOT DISTINCT FROM %(seen_held_by)s::bigint", "IS NOT NULL"),
        ),
        "sqlite": (
            ("outbox_resolve", "attempt = :seen_attempt\n", "true\n"),
            ("outbox_resolve", "IS :seen_held_by", "IS NOT NULL"),
        ),
    },
    "resolver-report-race": _NO_REPORT_FENCE,
}


def check(names: tuple[str, ...]) -> None:
    unknown = [name for name in names if name not in MUTATIONS]
    if unknown:
        raise ConfigurationError(
            f"unknown mutation {unknown[0]!r}; known: {', '.join(sorted(MUTATIONS))}"
        )


def wrong_iso_week() -> PeriodKind:
    """The classic bug: `%Y` is the calendar year, but ISO week numbers belong to the ISO year
    (2025-12-29 is 2026-W01, which %Y calls 2025-W01)."""

    def of(instant: datetime) -> str:
        return instant.strftime("%Y-W%V")

    return PeriodKind(iso_week.name, of, iso_week.check)


def apply(store: Any, names: tuple[str, ...]) -> None:
    """Rewrite this process's copy of the store's queries, and replace what the mutations
    replace in this process."""
    rewrite_queries(store._q, store.dialect, names)  # a test switch reaches inside, on purpose
    if "no-group-head-fence" in names and store.dialect == "postgres":
        switches.unfence_group_heads(store)
    switches.switch_on(names)


def rewrites_sql(name: str, dialect: str) -> bool:
    """Whether mutation `name` rewrites `dialect`'s own queries. One that does not changes only
    Python code both stores run (or their schemas alike): caught on one store, it is caught."""
    return bool(_QUERY_REWRITES.get(name, {}).get(dialect))


def rewrite_queries(queries: dict[str, str], dialect: str, names: tuple[str, ...]) -> None:
    for name in names:
        for query, old, new in _QUERY_REWRITES.get(name, {}).get(dialect, ()):
            if old not in queries[query]:
                raise RuntimeError(f"mutation cannot find {old!r} in query {query}: update it")
            queries[query] = queries[query].replace(old, new)


@contextmanager
def mutated(*names: str) -> Iterator[None]:
    """The mutations `names` on, for the tests that catch one: every store this process opens
    meanwhile runs the rewritten queries, and the process-wide switches are set; all put back
    on exit. (A store opened before is untouched: open the test's stores inside.)"""
    from oncebox.store import postgres, sqlite  # noqa: PLC0415

    check(names)

    def loader(original: Callable[..., dict[str, Any]], dialect: str) -> Callable[..., Any]:
        def load(*args: Any, **kwargs: Any) -> dict[str, Any]:
            queries = original(*args, **kwargs)
            rewrite_queries(queries, dialect, names)
            return queries

        return load

    for module, dialect in ((postgres, "postgres"), (sqlite, "sqlite")):
        switches.patch(module, "load_queries", loader(vars(module)["load_queries"], dialect))
    switches.switch_on(names)
    try:
        yield
    finally:
        undo_process_wide()


def undo_process_wide() -> None:
    """Put back what a mutation replaced in this process (the harness runs many scenarios in
    one process; a worker process simply exits)."""
    switches.undo()


def drop_unique_claim(conn: Any, dialect: str) -> None:
    """Schema part of `no-unique-index`, run once per run database."""
    if dialect == "postgres":
        conn.execute("ALTER TABLE oncebox_intents DROP CONSTRAINT oncebox_intents_pkey")
    else:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(oncebox_intents)")]
        listed = ", ".join(columns)
        conn.execute("CREATE TABLE oncebox_intents_copy AS SELECT * FROM oncebox_intents")
        conn.execute("DROP TABLE oncebox_intents")
        conn.execute(f"CREATE TABLE oncebox_intents AS SELECT {listed} FROM oncebox_intents_copy")
        conn.execute("DROP TABLE oncebox_intents_copy")
    conn.commit()

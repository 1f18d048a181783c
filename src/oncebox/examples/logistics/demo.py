"""`oncebox demo`: the weekly freight digest, end to end, under real faults.

1. A database (`./oncebox-demo.db` unless `--db`) with a few hundred customers — some inactive,
   one whose address is broken (the poison message) — their shipments, and dock-slot holds.
2. The `weekly-digest` schedule fans out the week (the current ISO week unless `--period`).
3. Workers run until idle while faults are injected: a duplicate publish (the same jobs enqueued
   again, and redelivered by a broker), a worker process SIGKILLed between the provider's
   acceptance and its record, and — on the embedded file sink — a lost acknowledgement and a 429
   burst. Time is the database's and is advanced by the demo (a retry 30 s away, a pause, a
   lease that must run out), so the run takes seconds.
4. The same week's fan-out runs again, and the holds sweeper expires the due holds.
5. The invariants are checked from the database and the delivered files: every eligible customer
   got one digest (or is the poison, dead-lettered with its reason; or — with a provider
   without idempotency keys — is `ambiguous` and listed); never two; nothing lost; each expired
   hold got one notice.

Exit 0 when they hold, 1 with the evidence when one does not.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from email import message_from_bytes
from pathlib import Path
from typing import Any, TextIO

from oncebox import Box, WorkerConfig
from oncebox.examples.logistics.app import (
    DIGEST_KEY,
    HOLD_KEY,
    SENDER,
    build_box,
    connect,
    create_tables,
    hold_expiry_value,
)
from oncebox.examples.logistics.faults import FaultyFileSink
from oncebox.examples.logistics.seed import seed_freight
from oncebox.jobs.periods import iso_week
from oncebox.kernel import points
from oncebox.kernel.clock import ClockLease, monotonic, real_now
from oncebox.kernel.errors import ConfigurationError
from oncebox.outbox.tokens import derive_token
from oncebox.providers import from_url
from oncebox.store import open_store
from oncebox.testing import RedeliveringTransport

DEFAULT_DB = "oncebox-demo.db"
DIGEST_SUBJECT = "Your shipments, "
HOLDS_EXPIRED = "SELECT count(*) FROM freight_holds WHERE state = 'expired'"
WORKER = WorkerConfig(until_idle=True, exit_on_hung_handler=False, simulated_time=True)
# The demo simulates its week from the Monday 09:00 fire to about an hour after it: the fire
# must be at least this far in the real past (see `_simulate`).
SIMULATION_MARGIN = timedelta(hours=2)
DIGESTS_SENT = (
    "SELECT count(*) FROM oncebox_outbox WHERE state = 'sent' AND intent_key LIKE "
    "'weekly-digest/' || ?"
)


@dataclass
class DemoOptions:
    db: str = f"sqlite:///{DEFAULT_DB}"
    customers: int = 300
    period: str | None = None
    email: str | None = None
    faults: bool = True
    seed: int = 42


@dataclass
class DemoReport:
    period: str = ""
    eligible: int = 0
    delivered: int = 0
    enqueue_dedupes: int = 0
    claim_conflicts: int = 0
    sink_duplicates: int = 0
    dead_jobs: list[str] = field(default_factory=list)
    dead_messages: list[str] = field(default_factory=list)
    ambiguous: list[str] = field(default_factory=list)
    retries: dict[str, int] = field(default_factory=dict)  # attempt outcome -> count
    possible_duplicates: int = 0
    holds_expired: int = 0
    second_fan_out_enqueued: int = 0
    faults: list[str] = field(default_factory=list)
    skipped_faults: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    outbox_dir: str | None = None


@dataclass
class DemoRun:
    """What every step of one demo run shares."""

    options: DemoOptions
    box: Box
    email: str
    secret: str
    period: str
    outbox_dir: Path
    report: DemoReport
    out: TextIO
    poison: int = 0
    faulty: FaultyFileSink | None = None
    clock: ClockLease | None = None  # the demo's hold on the database's clock, once it froze it


class Progress:
    """A one-line progress bar on a terminal; plain lines when the output is not one."""

    def __init__(self, stream: TextIO, label: str, total: int) -> None:
        self.stream, self.label, self.total = stream, label, max(total, 1)
        self.tty = stream.isatty()
        self.shown = -1
        self.written = -1

    def update(self, done: int) -> None:
        if self.tty:
            filled = int(30 * min(done, self.total) / self.total)
            self.stream.write(
                f"\r  {self.label} [{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total}"
            )
            self.stream.flush()
        elif done * 4 // self.total != self.shown and done < self.total:
            self.shown = done * 4 // self.total
            self._line(done)

    def finish(self, done: int) -> None:
        if self.tty:
            self.update(done)
            self.stream.write("\n")
        elif done != self.written:
            self._line(done)

    def _line(self, done: int) -> None:
        self.written = done
        self.stream.write(f"  {self.label}: {done}/{self.total}\n")


def _reset(options: DemoOptions) -> Path:
    """The default demo file and the outbox directory are the demo's own: start them afresh.
    Any other database is left alone, and must hold no jobs and no customers yet — checked
    before anything is written to it."""
    outbox = Path("oncebox-demo-outbox")
    if options.db == f"sqlite:///{DEFAULT_DB}":
        for suffix in ("", "-wal", "-shm", ".clock"):
            Path(DEFAULT_DB + suffix).unlink(missing_ok=True)
    else:
        _require_empty(options.db)
    if options.email is None and outbox.exists():
        for eml in outbox.glob("*.eml"):
            eml.unlink()
    return outbox


def _require_empty(url: str) -> None:
    """Read-only: count the rows of the tables the demo would write, if they exist."""
    store = open_store(url, migrate=False)
    held = []
    try:
        conn = getattr(store, "connect")()  # noqa: B009 (both stores have one)
        try:
            for table in ("oncebox_all_jobs", "freight_customers"):
                try:
                    if conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]:
                        held.append(table)
                except Exception:  # a missing table is an empty one
                    conn.rollback()
        finally:
            conn.close()
    finally:
        store.close()
    if held:
        raise ConfigurationError(
            f"the demo needs a database of its own; {url} already holds rows in "
            f"{' and '.join(held)} (use a new database, or the default file)"
        )


def latest_period(now: datetime) -> str:
    """The demo's default week: the current one once its Monday 09:00 is `SIMULATION_MARGIN`
    past, else the one before."""
    current = iso_week(now)
    return (
        current
        if _monday_fire(current) + SIMULATION_MARGIN <= now
        else iso_week(now - timedelta(days=7))
    )


def _monday_fire(period: str) -> datetime:
    year, week = period.split("-W")
    monday = datetime.fromisocalendar(int(year), int(week), 1)
    return monday.replace(hour=9, tzinfo=UTC)


def _dispatch_and_die(url: str, email: str, secret: str) -> None:
    """A worker process killed (SIGKILL) after the provider accepted a message, before its
    record: the message was delivered, and nobody wrote that down."""
    box = build_box(url, email=email, secret=secret)
    points.install("dispatcher.after_provider_accept_before_record", points.kill)
    box.dispatcher().run_once()
    os._exit(3)


def _count(box: Box, sql: str, params: tuple[Any, ...] = ()) -> int:
    conn = connect(box)
    try:
        ph = "%s" if box.store.dialect == "postgres" else "?"
        row = conn.execute(sql.replace("?", ph), params).fetchone()
        return int(row[0]) if row else 0
    finally:
        conn.close()


def _work_until_done(demo: DemoRun, progress: Progress | None, total: Callable[[], int]) -> None:
    """Run workers until nothing is workable, advancing the database's clock over the waits the
    faults cause (retries, a channel pause, a lease that must run out)."""
    box = demo.box
    for _round in range(60):
        worker = threading.Thread(
            target=box.work,
            kwargs={"config": WORKER},
        )
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
            if progress:
                progress.update(total())
        times = box.store.status_times()
        upcoming = times.next_event()
        if upcoming is None:
            return
        current = box.store.clock_get().frozen_at or times.now
        _simulate(demo, max(current, upcoming) + timedelta(seconds=1))
    raise RuntimeError("the demo did not settle within 60 rounds")


def _simulate(demo: DemoRun, instant: datetime) -> None:
    """Move the demo's frozen clock — never past the real time minus a margin. What the demo
    writes at simulated times (leases, retries, pauses, the schedule's last fire) must be in the
    real past for the workers that use the database after it, even if the demo is killed."""
    assert demo.clock is not None
    demo.clock.set(frozen_at=min(instant, real_now() - SIMULATION_MARGIN / 4))


def run(options: DemoOptions, out: TextIO = sys.stdout) -> DemoReport:
    started = monotonic()
    period = options.period or latest_period(real_now())
    iso_week.check(period)
    if _monday_fire(period) + SIMULATION_MARGIN > real_now():
        raise ConfigurationError(
            f"the demo replays a week whose Monday 09:00 UTC is at least "
            f"{SIMULATION_MARGIN.seconds // 3600} hours past, so that its simulated clock stays "
            f"behind the real one: {period} is too recent (try {latest_period(real_now())})"
        )
    outbox_dir = _reset(options)
    secret_box = Box(options.db)
    secret_box.store.schema_migrate()  # the demo's database is the demo's own
    secret = secret_box.init_secret()  # stored in the demo's database: every worker agrees
    secret_box.close()
    email = options.email or f"file://{outbox_dir}"
    box = build_box(options.db, email=email, secret=secret)
    demo = DemoRun(options, box, email, secret, period, outbox_dir, DemoReport(period=period), out)
    try:
        _prepare(demo)
        _fan_out_and_work(demo)
        _collect(demo)
        demo.report.violations = check_invariants(demo)
        demo.report.outbox_dir = str(outbox_dir.resolve()) if options.email is None else None
    finally:
        if demo.clock is not None:
            demo.clock.release()
        box.close()
    demo.report.seconds = round(monotonic() - started, 1)
    _print(demo.report, out)
    return demo.report


def _prepare(demo: DemoRun) -> None:
    """Tables, seed data, the database's clock at the schedule's Monday, and the faulty sink."""
    box, options, report = demo.box, demo.options, demo.report
    fire = _monday_fire(demo.period)
    create_tables(box)
    demo.clock = ClockLease(box.store)  # lapses by itself if the demo is killed
    _simulate(demo, fire + timedelta(seconds=30))
    demo.poison = seed_freight(
        box, options.customers, demo.period, random.Random(options.seed), fire
    )
    demo.out.write(f"oncebox demo · {box.where} · period {demo.period} · email {demo.email}\n")
    if options.faults and options.email is None:
        lose = {
            derive_token(demo.secret, DIGEST_KEY.format(customer_id=c, period=demo.period))
            for c in (3, 11, 29)
        }
        demo.faulty = FaultyFileSink(from_url(demo.email), throttle=3, lose_ack_tokens=lose)
        box.channel("email", provider=demo.faulty, sender=SENDER)
        report.faults += [
            "lost acknowledgements from the file sink (3)",
            "a 429 burst (3 answers, Retry-After 30 s)",
        ]
    elif options.faults:
        report.skipped_faults.append(
            "lost acknowledgements and a 429 burst: injected only around the embedded file "
            "sink; a real provider's faults are its own"
        )


def _fan_out_and_work(demo: DemoRun) -> None:
    box, out, report = demo.box, demo.out, demo.report
    out.write("1. fan-out of the week\n")
    [fan_out] = box.ticker().run_once().fan_outs
    report.eligible = fan_out.eligible
    out.write(f"   {fan_out.eligible} eligible customers, {fan_out.enqueued} jobs enqueued\n")
    if demo.options.faults:
        _inject_publish_faults(demo)
        _inject_worker_kill(demo)

    out.write("2. workers run until idle\n")
    progress = Progress(out, "digests sent", report.eligible)
    _work_until_done(demo, progress, lambda: _count(box, DIGESTS_SENT, ("%",)))
    progress.finish(_count(box, DIGESTS_SENT, ("%",)))

    out.write("3. the same week's fan-out again, and the holds sweeper\n")
    again = box.run_schedule("weekly-digest", demo.period)
    report.second_fan_out_enqueued = again.enqueued
    out.write(f"   {again.eligible} eligible again, {again.enqueued} enqueued (all claimed)\n")
    now = box.store.clock_now()
    later = _monday_fire(demo.period) + timedelta(hours=1)
    _simulate(demo, max(now, later))
    _work_until_done(demo, None, lambda: 0)
    out.write(f"   {_count(box, HOLDS_EXPIRED)} holds expired so far, each with its notice\n")


def _inject_publish_faults(demo: DemoRun) -> None:
    box, period, report, out = demo.box, demo.period, demo.report, demo.out
    customers = range(1, min(40, demo.options.customers + 1))
    some = [{"customer_id": c, "period": period} for c in customers if c % 10 != 7]
    duplicate = box.enqueue_many("weekly_digest", some)
    report.faults.append(f"a duplicate publish of {duplicate.skipped} jobs (absorbed at enqueue)")
    out.write(
        f"   fault: the fan-out's first {len(some)} jobs published again: "
        f"{duplicate.created} created, {duplicate.skipped} absorbed\n"
    )
    # a broker redelivering the same messages, twice each, once the jobs have run
    box.work(config=replace(WORKER, dispatch=False))
    broker = RedeliveringTransport(copies=2, seed=7)
    for args in some[:10]:
        broker.publish("weekly_digest", **args)
    consumer = box.consumer(transport=broker)
    try:
        redelivered = consumer.run_once()
    finally:
        consumer.session.close()
    report.faults.append(f"{redelivered.leased} broker redeliveries (absorbed at the claim)")
    out.write(
        f"   fault: a broker redelivers 10 messages twice: {redelivered.duplicates} "
        "duplicates absorbed by the claim\n"
    )


def _inject_worker_kill(demo: DemoRun) -> None:
    report, out = demo.report, demo.out
    context = multiprocessing.get_context("spawn")
    child = context.Process(
        target=_dispatch_and_die, args=(demo.options.db, demo.email, demo.secret)
    )
    child.start()
    child.join(120)
    killed = child.exitcode == -signal.SIGKILL
    if killed:
        report.faults.append("a worker SIGKILLed between the provider's acceptance and its record")
    else:
        report.skipped_faults.append(
            f"the worker to be killed mid-send exited {child.exitcode} instead (nothing to send?)"
        )
    out.write(
        f"   fault: a worker process killed mid-send ({'killed' if killed else 'not killed'})\n"
    )


def _collect(demo: DemoRun) -> None:
    box, report, period, faulty = demo.box, demo.report, demo.period, demo.faulty
    metrics = box.metrics
    report.enqueue_dedupes = metrics.counter("enqueue_deduplicated")
    report.claim_conflicts = metrics.counter("claim_conflicts")
    report.sink_duplicates = faulty.duplicates_detected if faulty else 0
    report.delivered = _count(
        box,
        "SELECT count(*) FROM oncebox_outbox WHERE state = 'sent' AND intent_key LIKE ?",
        (f"weekly-digest/%/{period}",),
    )
    report.holds_expired = _count(box, HOLDS_EXPIRED)
    conn = connect(box)
    try:
        report.dead_jobs = [
            f"{r[0]}: {str(r[1]).splitlines()[0]}"
            for r in conn.execute(
                "SELECT key, last_error FROM oncebox_all_jobs WHERE state = 'dead' ORDER BY key"
            )
        ]
        report.dead_messages = [
            r[0]
            for r in conn.execute(
                "SELECT key FROM oncebox_outbox WHERE state = 'dead' ORDER BY key"
            )
        ]
        report.ambiguous = [
            r[0]
            for r in conn.execute(
                "SELECT key FROM oncebox_outbox WHERE state = 'ambiguous' ORDER BY key"
            )
        ]
        report.retries = dict(
            conn.execute(
                "SELECT 'job ' || outcome, count(*) FROM oncebox_job_attempts GROUP BY outcome "
                "UNION ALL "
                "SELECT 'send ' || outcome, count(*) FROM oncebox_delivery_attempts WHERE "
                "outcome <> 'sent' GROUP BY outcome ORDER BY 1"
            ).fetchall()
        )
        report.possible_duplicates = int(
            conn.execute(
                "SELECT COALESCE(sum(possible_duplicates), 0) FROM oncebox_outbox"
            ).fetchone()[0]
        )
    finally:
        conn.close()


def check_invariants(demo: DemoRun) -> list[str]:
    """Every eligible customer delivered once, or dead (the poison), or ambiguous (only without
    provider idempotency); never two; nothing lost; one notice per expired hold."""
    box, report = demo.box, demo.report
    violations: list[str] = []
    conn = connect(box)
    try:
        active = [
            r[0]
            for r in conn.execute("SELECT id FROM freight_customers WHERE active = 1 ORDER BY id")
        ]
        rows: dict[str, list[tuple[str, str]]] = {}
        for key, state, token in conn.execute(
            "SELECT intent_key, state, token FROM oncebox_outbox ORDER BY id"
        ):
            rows.setdefault(key, []).append((state, token))
        lingering = conn.execute(
            "SELECT (SELECT count(*) FROM oncebox_all_jobs WHERE state IN ('ready', 'leased')), "
            "(SELECT count(*) FROM oncebox_outbox WHERE state IN ('pending', 'leased', "
            "'sending'))"
        ).fetchone()
        expired = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM freight_holds WHERE state = 'expired' ORDER BY id"
            )
        ]
        ph = "%s" if box.store.dialect == "postgres" else "?"
        overdue = [
            r[0]
            for r in conn.execute(
                f"SELECT id FROM freight_holds WHERE state = 'held' AND expires_at <= {ph}",
                (hold_expiry_value(box, box.store.clock_now()),),
            )
        ]
    finally:
        conn.close()
    violations += _check_digests(demo, active, rows)
    if overdue:
        violations.append(f"{len(overdue)} hold(s) past their expiry still held, e.g. {overdue[0]}")
    noticed = {key for key in rows if key.startswith("hold-expired/")}
    unexpected = sorted(noticed - {HOLD_KEY.format(hold_id=h) for h in expired})
    if unexpected:
        violations.append(f"notices for holds that did not expire: {unexpected[:5]}")
    if lingering[0] or lingering[1]:
        violations.append(f"not settled: {lingering[0]} jobs and {lingering[1]} messages")
    settled = [["sent"]] if box.channels["email"].idempotent else [["sent"], ["ambiguous"]]
    for hold in expired:
        key = HOLD_KEY.format(hold_id=hold)
        if [state for state, _t in rows.get(key, [])] not in settled:
            violations.append(f"{key}: expected one sent notice, found {rows.get(key)}")
    if report.second_fan_out_enqueued:
        violations.append(f"the second fan-out enqueued {report.second_fan_out_enqueued} jobs")
    if demo.options.email is None:
        violations += _check_files(demo.outbox_dir, rows)
    return violations


def _check_digests(
    demo: DemoRun, active: list[int], rows: dict[str, list[tuple[str, str]]]
) -> list[str]:
    """One sent digest per active customer (the poison: one dead job, no message); none for
    anyone else."""
    box, period, report = demo.box, demo.period, demo.report
    violations = []
    idempotent = box.channels["email"].idempotent
    if report.eligible != len(active):
        violations.append(f"eligible {report.eligible} != active customers {len(active)}")
    expected = set()
    for customer in active:
        key = DIGEST_KEY.format(customer_id=customer, period=period)
        expected.add(key)
        states = [state for state, _token in rows.get(key, [])]
        if customer == demo.poison:
            jobs = [job.state for job in box.store.job_find_by_key(key)]
            if states or jobs != ["dead"]:
                violations.append(
                    f"{key}: the poison should be one dead job and no message; "
                    f"messages {states}, jobs {jobs}"
                )
        elif states != ["sent"] and not (states == ["ambiguous"] and not idempotent):
            violations.append(f"{key}: expected one sent digest, found {states or 'none'}")
    strays = sorted(k for k in rows if k.startswith("weekly-digest/") and k not in expected)
    if strays:
        violations.append(f"{len(strays)} digest(s) for inactive customers, e.g. {strays[0]}")
    return violations


def _check_files(outbox_dir: Path, rows: dict[str, list[tuple[str, str]]]) -> list[str]:
    """The sink's own record: one file per sent message, none twice for one recipient+subject."""
    violations = []
    files = {path.stem: path for path in outbox_dir.glob("*.eml")}
    sent_tokens = {
        token for entries in rows.values() for state, token in entries if state == "sent"
    }
    missing = sorted(sent_tokens - set(files))
    if missing:
        violations.append(f"{len(missing)} sent message(s) without a file, e.g. {missing[0]}")
    extra = sorted(set(files) - sent_tokens)
    if extra:
        violations.append(f"{len(extra)} file(s) for no sent message, e.g. {files[extra[0]]}")
    seen: Counter[tuple[str, str]] = Counter()
    for path in files.values():
        message = message_from_bytes(path.read_bytes())
        if str(message["Subject"]).startswith(DIGEST_SUBJECT):
            # one digest per recipient and week; hold notices are one per hold, checked by key
            seen[(message["To"], message["Subject"])] += 1
    doubled = [f"{to}: {subject}" for (to, subject), n in seen.items() if n > 1]
    if doubled:
        violations.append(f"delivered twice: {doubled[:5]}")
    return violations


def _print(report: DemoReport, out: TextIO) -> None:
    out.write("\nsummary\n")
    lines = [
        ("period", report.period),
        ("eligible customers", report.eligible),
        ("digests delivered", report.delivered),
        (
            "duplicates absorbed",
            f"{report.enqueue_dedupes} at enqueue, {report.claim_conflicts} "
            f"at the claim, {report.sink_duplicates} by the file sink",
        ),
        ("dead letters", len(report.dead_jobs) + len(report.dead_messages)),
        ("ambiguous sends", len(report.ambiguous)),
        ("possible duplicates", report.possible_duplicates),
        (
            "recovered attempts",
            ", ".join(f"{n} {outcome}" for outcome, n in report.retries.items()) or "none",
        ),
        ("holds expired", f"{report.holds_expired}, one notice each"),
        ("time", f"{report.seconds} s"),
    ]
    for label, value in lines:
        out.write(f"  {label:<22}{value}\n")
    for dead in report.dead_jobs + report.dead_messages:
        out.write(f"  dead: {dead}\n")
    for key in report.ambiguous:
        out.write(f"  ambiguous (resolve with `oncebox outbox resolve`): {key}\n")
    for fault in report.faults:
        out.write(f"  fault injected: {fault}\n")
    for fault in report.skipped_faults:
        out.write(f"  fault skipped: {fault}\n")
    if report.outbox_dir:
        out.write(f"  the .eml files are in {report.outbox_dir}\n")
    if report.violations:
        out.write("\nINVARIANTS VIOLATED\n")
        for violation in report.violations:
            out.write(f"  - {violation}\n")
    else:
        out.write(
            "\ninvariants hold: every eligible customer has one digest (the poison "
            "is dead-lettered with its reason); nothing was sent twice; nothing was lost\n"
        )


def main(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    report = run(options, out)
    return 1 if report.violations else 0

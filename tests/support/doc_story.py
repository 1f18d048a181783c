"""The operator story the docs' command samples come from: `make doc-samples` runs it and writes
what every command printed into docs/cli.md, runbook.md and deploy.md; tests/test_doc_samples.py
runs it again and compares. So a sample is what the command prints, not what someone remembers it
printing.

It runs in a new temporary directory, as a user would in an empty one: the demo with 40 customers
for a fixed past week (2026-W49), then a session against its database with the shipped logistics
app (`--app oncebox.examples.logistics`: no module to write), replaying, resolving, cancelling,
discarding, accepting drifted keys, and finally a clock a killed process left frozen. A few side
scenes use databases of their own (a fresh one to migrate, a second freight database without a
secret, a shop with a delayed job, the chaos harness) and run beside the main one, as do
read-only commands between two writes: the whole story stays well under a minute on two cores.
Every command reads the host's clock as if the story began on that week's Thursday
(`pin_story_clock`), so what ages — payloads past retention, the schedule's next fire — prints the
same on any later day.

Run it: `make doc-samples` (or `python tests/support/doc_story.py [--check]`).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `support.*` importable as in the tests
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oncebox.fakes.smtp_sink import SmtpSink
from support.doc_samples import (
    DOCS,
    STORY_PREFIX,
    Run,
    Shorten,
    Story,
    StoryError,
    base_environment,
    blocks,
    expected,
    finish,
    mask,
    pin_story_clock,
    resume,
    rewrite,
    run_command,
    stop,
)
from support.doc_story_apps import HOLD_CLOCK, MODULES

PERIOD = "2026-W49"  # a past week: the demo simulates it on a clock behind the story's
STORY_NOW = datetime(2026, 12, 3, 12, tzinfo=UTC)  # when the story happens: that week's Thursday
DEMO_DB = "sqlite:///oncebox-demo.db"
FREIGHT = "oncebox.examples.logistics"  # the demo's own app, as shipped
SESSION = {"ONCEBOX_DB": DEMO_DB, "ONCEBOX_APP": FREIGHT, "USER": "ops-alice"}
DOCUMENTS = ("cli.md", "runbook.md", "deploy.md")

# -- the main session ----------------------------------------------------------------------------


def main_story(story: Story, smtp: SmtpSink) -> None:
    demo(story)
    schedules(story)
    enqueues_and_fan_outs(story)
    smtp_trouble(story, smtp)
    inspection(story)
    cancelling(story)
    replaying(story)
    resolving(story)
    key_drift(story)
    frozen_clock(story)


def demo(story: Story) -> None:
    story.cmd("demo", f"demo --customers 40 --period {PERIOD}")
    with story.reads():
        story.cmd("status-json-after-demo", "status --json")
        story.cmd("keys-check", "keys check")
        story.cmd("keys-check-json", "keys check --json")
        story.cmd(
            "schedule-list-db-only", "schedule list", env={"ONCEBOX_APP": ""}, comment="--db only"
        )
        story.cmd("schedule-list", "schedule list", comment=f"with ONCEBOX_APP={FREIGHT}")
        story.cmd("schedule-list-json", "schedule list --json")


def schedules(story: Story) -> None:
    """Pausing and resuming first also moves the scheduler's mark to now: no worker of this
    story fans out a week of its own, whatever the date it runs on."""
    story.cmd("schedule-pause", "schedule pause weekly-digest --reason 'customer data migration'")
    with story.reads():
        story.cmd("schedule-list-paused", "schedule list")
        story.cmd("schedule-pause-unknown", "schedule pause monthly --reason x", code=2)
    story.cmd("schedule-resume", "schedule resume weekly-digest --reason 'migration done'")
    story.cmd("schedule-list-resumed", "schedule list")
    # the dock holds that fell due since the demo's Monday expire, each with its notice
    story.cmd("worker-holds", "worker --until-idle")


def enqueues_and_fan_outs(story: Story) -> None:
    digest = "enqueue weekly_digest"
    story.cmd("enqueue-created", f"{digest} customer_id=5 period=2026-W50")
    with story.reads():
        story.cmd("enqueue-held", f"{digest} customer_id=5 period=2026-W50")
        story.cmd("enqueue-claimed", f"{digest} customer_id=1 period={PERIOD}")
        story.cmd("enqueue-claimed-json", f"{digest} customer_id=1 period={PERIOD} --json")
        story.cmd("enqueue-missing-argument", f"{digest} customer_id=1", code=2)
        story.cmd("enqueue-not-an-int", f"{digest} customer_id=x1 period=2026-W50", code=2)
        story.cmd("enqueue-no-such-task", "enqueue no_such_task x=1", code=2)
        story.cmd(
            "enqueue-run-at-too-early",
            f"{digest} customer_id=1 period=2026-W50 --run-at 1969-12-31T00:00:00",
            code=2,
        )
        story.cmd("schedule-run-impossible", "schedule run weekly-digest --period 2026-W99", code=2)
    story.cmd("schedule-run-again", f"schedule run weekly-digest --period {PERIOD}")
    story.cmd("schedule-run", "schedule run weekly-digest --period 2026-W50")
    story.cmd("schedule-run-json", "schedule run weekly-digest --period 2026-W50 --json")
    story.cmd("worker", "worker --until-idle")


def smtp_trouble(story: Story, smtp: SmtpSink) -> None:
    """Four digests of 2026-W51 through a scripted SMTP server: two acknowledgements lost (the
    messages are ambiguous), one recipient refused (dead), one content refused (dead, and no
    provider will take it: it is discarded, and its job re-run)."""
    for customer in (1, 2, 3, 6):
        enqueue = f"enqueue weekly_digest customer_id={customer} period=2026-W51"
        story.cmd(f"enqueue-w51-{customer}", enqueue)
    smtp.script("drop", "drop", "550 5.1.1 no such user", "554 5.6.0 message content rejected")
    story.cmd("worker-smtp", f"worker --until-idle --email '{smtp.url}'")
    if len(smtp.received) != 2:
        raise StoryError(f"the SMTP server should have 2 messages, it has {len(smtp.received)}")
    c6 = "weekly-digest/customer-6/2026-W51"
    reason = "'a footer the relay rejects; template fixed in release 2026.12.2'"
    story.cmd("outbox-discard", f"outbox discard {c6} --reason {reason}")
    story.cmd("outbox-discard-again", f"outbox discard {c6} --reason again", code=2)
    job = job_id(story, c6)
    story.cmd("dlq-replay-discarded", f"dlq replay {job} --reason 'release 2026.12.2'")
    story.cmd(
        "enqueue-timer-json",
        f"enqueue weekly_digest customer_id=3 period=2026-W53 --delay {28 * 24 * 3600} --json",
    )


def inspection(story: Story) -> None:
    poison = f"weekly-digest/customer-20/{PERIOD}"
    c3_w51 = message_id(story, "weekly-digest/customer-3/2026-W51")
    c1_w51 = message_id(story, "weekly-digest/customer-1/2026-W51")
    page = job_id(story, "weekly-digest/customer-34/2026-W50")
    first_only = Shorten(items=1)
    with story.reads():
        story.cmd("status", "status")
        story.cmd("plan", "plan --window 4h --rate 14/s --eligible 1000000 --per-lane 50")
        story.cmd("prune-dry-run", "prune --dry-run")
        story.cmd("prune-dry-run-json", "prune --dry-run --json", shorten=Shorten(items=2))
        story.cmd("jobs-list-dead", "jobs list --state dead")
        story.cmd("jobs-list-dead-json", "jobs list --state dead --json", shorten=first_only)
        story.cmd(
            "jobs-list-page",
            f"jobs list --schedule weekly-digest --period 2026-W50 --limit 3 --before {page}",
        )
        story.cmd("jobs-show", f"jobs show {poison}")
        story.cmd("jobs-show-json", f"jobs show {poison} --json", shorten=first_only)
        story.cmd("jobs-show-id", "jobs show 1")
        story.cmd("jobs-show-unknown", f"jobs show weekly-digest/customer-99/{PERIOD}", code=2)
        story.cmd("jobs-show-bad-key", "jobs show 'bad key'", code=2)
        story.cmd("jobs-list-bad-state", "jobs list --state sleeping", code=2)
        story.cmd("dlq-list", "dlq list")
        story.cmd("dlq-list-contradiction", "dlq list --kind delivery --task weekly_digest", code=2)
        story.cmd("dlq-list-delivery-json", "dlq list --kind delivery --json")
        story.cmd("dlq-show", f"dlq show {poison}", shorten=Shorten())
        story.cmd("dlq-show-id", f"dlq show {c3_w51}")
        story.cmd("dlq-show-id-as-job", f"dlq show {c3_w51} --kind job", code=2)
        story.cmd("outbox-list", "outbox list --limit 5")
        story.cmd("outbox-list-sent-json", "outbox list --state sent --limit 1 --json")
        story.cmd("outbox-show", "outbox show weekly-digest/customer-1/2026-W51")
        story.cmd("outbox-show-json", f"outbox show {c1_w51} --json", shorten=Shorten(strings=80))
        story.cmd("outbox-show-lease-expired", f"outbox show weekly-digest/customer-1/{PERIOD}")
    # a worker, even one that refuses to start, does not run beside `status`, which counts them
    short = {"ONCEBOX_SECRET": "short"}
    story.cmd("secret-too-short", "worker --until-idle", env=short, code=2)


def cancelling(story: Story) -> None:
    c4 = "weekly-digest/customer-4/2026-W52"
    reason = "'customer closed the account (ticket 4409)'"
    story.cmd("enqueue-delayed", "enqueue weekly_digest customer_id=4 period=2026-W52 --delay 3600")
    copy_database(story.cwd / "oncebox-demo.db", story.cwd / "copy.db")
    story.cmd("jobs-cancel", f"jobs cancel {c4} --reason {reason}")
    with story.reads():
        story.cmd(
            "jobs-cancel-done", f"jobs cancel weekly-digest/customer-1/{PERIOD} --reason x", code=2
        )
        story.cmd(
            "jobs-cancel-json",
            f"jobs cancel {c4} --reason {reason} --json",
            env={"ONCEBOX_DB": "sqlite:///copy.db"},
        )


def replaying(story: Story) -> None:
    poison = f"weekly-digest/customer-20/{PERIOD}"
    fixed = "'address fixed in the CRM (ticket 4410)'"
    c3_w51 = message_id(story, "weekly-digest/customer-3/2026-W51")
    story.cmd("dlq-replay-json", f"dlq replay {poison} --reason {fixed} --json")
    with story.reads():
        story.cmd("dlq-replay-not-dead", f"dlq replay {poison} --reason again", code=2)
        story.cmd("dlq-replay-id-is-a-job-id", f"dlq replay {c3_w51} --reason x", code=2)
    replay_all_while_bob_replays_one(story, fixed)
    story.cmd("dlq-replay-all-nothing", "dlq replay --all --reason again")
    c3 = "weekly-digest/customer-3/2026-W51"
    story.cmd("audit-list-key-json", f"audit list --key {c3} --json")


def replay_all_while_bob_replays_one(story: Story, fixed: str) -> None:
    """`dlq replay --all` reads its list once, then replays at --rate: a row someone else replays
    before its turn is skipped. The bulk replay is stopped (SIGSTOP) as soon as it printed its
    first replay, while it waits 2 s for its second turn; Bob replays that row; the bulk replay
    goes on. Were Bob too late, his replay would exit 2 and the story stop."""
    bulk = Run(shlex.split("dlq replay --all --rate 0.5 --reason 'SMTP relay fixed (INC-2207)'"))
    process = run_command(bulk.args, cwd=story.cwd, env=story.env({}))
    assert process.stdout is not None
    first = process.stdout.readline()
    stop(process)
    try:
        story.cmd(
            "dlq-replay-bob",
            f"dlq replay weekly-digest/customer-20/2026-W50 --reason {fixed} --actor ops-bob",
        )
    finally:
        resume(process)
    story.record("dlq-replay-all", bulk, None, *finish(process, first))


def resolving(story: Story) -> None:
    c1 = "weekly-digest/customer-1/2026-W51"
    c2 = message_id(story, "weekly-digest/customer-2/2026-W51")
    arrived = "'customer confirms it arrived (ticket 4412)'"
    receipt = "'<20261203.73@mx.customer.example>'"
    story.cmd("outbox-resolve-neither", f"outbox resolve {c1} --reason x", code=2)
    story.cmd(
        "outbox-resolve-sent", f"outbox resolve {c1} --sent --receipt {receipt} --reason {arrived}"
    )
    story.cmd(
        "outbox-resolve-resend-json",
        f"outbox resolve {c2} --resend --reason 'provider log shows no delivery' --json",
    )
    with story.reads():
        story.cmd(
            "outbox-resolve-not-ambiguous", f"outbox resolve {c1} --resend --reason again", code=2
        )
        story.cmd("audit-list", "audit list")


def key_drift(story: Story) -> None:
    """Three other versions of the code meet the database: another module, a rename, and a
    careless refactor whose changes are then accepted."""
    v2 = {"ONCEBOX_APP": "freightapp_v2"}
    invoicing = {"ONCEBOX_APP": "invoicing"}
    with story.reads():
        story.cmd("keys-check-invoicing", "keys check", env=invoicing, code=1)
        renamed = {"ONCEBOX_APP": "freightapp_renamed"}
        story.cmd("keys-check-renamed", "keys check", env=renamed, code=1)
        story.cmd("keys-check-v2", "keys check", env=v2, code=1)
        v2_enqueue = "enqueue weekly_digest customer_id=3 period=2026-W51"
        story.cmd("enqueue-v2", v2_enqueue, env=v2, code=1)
    story.cmd("worker-v2", "worker --until-idle", env=v2, code=3)
    story.cmd(
        "keys-accept-task",
        "keys accept task:weekly_digest --reason 'key scheme v2 (RFC-12)'",
        env=v2,
    )
    with story.reads():
        story.cmd("keys-accept-again", "keys accept weekly_digest --reason again", env=v2)
        story.cmd("keys-accept-unknown", "keys accept nope --reason x", env=v2, code=2)
        story.cmd(
            "keys-accept-ambiguous", "keys accept weekly_digest --reason x", env=invoicing, code=2
        )
    story.cmd(
        "keys-accept-schedule-json",
        "keys accept schedule:weekly-digest --reason 'digests follow Berlin office hours' --json",
        env=v2,
    )
    with story.reads():
        story.cmd("keys-check-v2-accepted", "keys check", env=v2)
        old = {"ONCEBOX_APP": FREIGHT}
        story.cmd("keys-check-old-code", "keys check", env=old, code=1)
        story.cmd("audit-list-accept-keys", "audit list --action accept-keys")


def frozen_clock(story: Story) -> None:
    """A test run froze the database's clock and was killed: its setting stays until it lapses
    (here in 10 minutes) or someone resets it."""
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_CLOCK, DEMO_DB],
        cwd=story.cwd,
        env=base_environment(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdout is not None
        held = holder.stdout.readline().strip() == "held"
        holder.kill()
    if not held:
        raise StoryError("the clock holder did not freeze the clock")
    with story.reads():
        story.cmd("clock-show", "clock show")
        story.cmd("status-frozen-clock", "status")
    story.view("status-clock-line", "status-frozen-clock", keep=slice(0, 1))
    story.cmd("worker-frozen-clock", "worker --until-idle", code=1)
    story.cmd("clock-reset", "clock reset --reason 'the CI run that froze it was killed'")


# -- scenes on databases of their own ------------------------------------------------------------


def side_scenes(story: Story) -> None:
    """Mistakes that stop a command before it reads anything, and databases of their own."""
    conn = sqlite3.connect(story.cwd / "blank.db")
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.close()
    unset = {"ONCEBOX_APP": ""}
    with story.reads():
        story.cmd("worker-without-app", "worker", env=unset, code=2)
        nothing = {"ONCEBOX_DB": "", "ONCEBOX_APP": ""}
        story.cmd("status-without-db", "status", env=nothing, code=2)
        story.cmd("status-pinned", f"status --app pinned --db {DEMO_DB}", code=2)
        story.cmd("status-typo", "status --db sqlite:///oncebox-dmeo.db", env=unset, code=2)
        story.cmd(
            "status-blank",
            "status --db sqlite:///blank.db",
            env=unset,
            comment="a SQLite file without oncebox's tables",
            code=1,
        )
        story.cmd(
            "status-unreachable",
            "status --db 'postgresql://app:s3cret@127.0.0.1:1/app?connect_timeout=2'",
            code=1,
        )
    story.cmd("migrate", "migrate --db sqlite:///fresh.db")
    story.cmd("migrate-again", "migrate", env={"ONCEBOX_DB": "sqlite:///fresh.db"})

    shop = {"ONCEBOX_DB": "sqlite:///shop.db"}
    story.cmd(
        "shop-enqueue",
        f"enqueue weekly_digest customer_id=42 period={PERIOD} --delay 1800 --app shop",
        env=shop,
    )
    story.cmd("worker-work-remains", "worker --app shop --until-idle", env=shop, code=3)
    story.with_exit_code("worker-work-remains")

    second = {"ONCEBOX_DB": "sqlite:///freight2.db"}
    second_freight_database(story.cwd / "freight2.db")
    story.cmd(
        "freight2-enqueue", f"enqueue weekly_digest customer_id=1 period={PERIOD}", env=second
    )
    story.cmd("worker-stores-secret", "-v worker --until-idle", env=second)


def second_freight_database(path: Path) -> None:
    """A freight database with one customer and no secret. Its schedule is paused, so that a
    worker's first tick fans out nothing whatever the day."""
    from oncebox.examples.logistics.app import build_box, connect, create_tables

    box = build_box(f"sqlite:///{path}", email="null:")
    try:
        create_tables(box)
        conn = connect(box)
        conn.execute("INSERT INTO freight_customers VALUES (1, 'Customer 1', 'ops1@x.example', 1)")
        conn.commit()
        conn.close()
        box.pause_schedule("weekly-digest", reason="a second database for the docs", actor="docs")
    finally:
        box.close()


def chaos_scenes(story: Story) -> None:
    story.cmd("chaos-manual-rerun", "chaos --scenario manual-rerun --customers 20")
    story.cmd("chaos-clock-holder-killed", "chaos --scenario clock-holder-killed --customers 20")


# -- helpers -------------------------------------------------------------------------------------


def copy_database(source: Path, target: Path) -> None:
    """A consistent copy of a live SQLite database (its WAL included)."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    src.close()
    dst.close()


def _query(story: Story, sql: str, key: str) -> str:
    conn = sqlite3.connect(story.cwd / "oncebox-demo.db")
    try:
        row = conn.execute(sql, (key,)).fetchone()
    finally:
        conn.close()
    if row is None:
        raise StoryError(f"no row for {key}")
    return str(row[0])


def message_id(story: Story, key: str) -> str:
    return _query(story, "SELECT id FROM oncebox_outbox WHERE key = ?", key)


def job_id(story: Story, key: str) -> str:
    return _query(story, "SELECT id FROM oncebox_all_jobs WHERE key = ?", key)


# -- the whole story -----------------------------------------------------------------------------


def record(*, keep: bool = False) -> dict[str, str]:
    """Every sample, from one run of the story in a new temporary directory (`keep`: left in
    place, to look at afterwards)."""
    pin_story_clock(STORY_NOW)
    workdir = Path(tempfile.mkdtemp(prefix=STORY_PREFIX))
    if keep:
        print(f"the story runs in {workdir}", file=sys.stderr)
    try:
        for name, text in MODULES.items():
            (workdir / name).write_text(text)
        session = Story(workdir, dict(SESSION))
        side = Story(workdir, dict(SESSION))
        chaos = Story(workdir, {})
        with _port_2525_if_free() as smtp, ThreadPoolExecutor(2) as pool:
            scenes: list[Future[None]] = [pool.submit(chaos_scenes, chaos)]
            scenes.append(pool.submit(side_scenes, side))
            main_story(session, smtp)
            for scene in scenes:
                scene.result()
        samples = {**session.samples, **side.samples, **chaos.samples}
        return samples
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def _port_2525_if_free() -> Iterator[SmtpSink]:
    """The docs' port, unless something on this machine has it (another story, run at once):
    then the next free one of four digits too. The port is masked, but a column the CLI cuts to
    its width cuts an error that names a five-digit port one character earlier."""
    for port in range(2525, 2600):
        try:
            sink = SmtpSink(port=port).start()
            break
        except OSError:  # in use
            continue
    else:
        sink = SmtpSink().start()
    try:
        yield sink
    finally:
        sink.stop()


def documents() -> list[Path]:
    return [DOCS / name for name in DOCUMENTS]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 on a difference")
    parser.add_argument("--show", action="store_true", help="print every sample; change nothing")
    parser.add_argument("--keep", action="store_true", help="keep the story's directory")
    parser.add_argument(
        "--all", action="store_true", help="rewrite every block, also those current but for masks"
    )
    options = parser.parse_args(argv)
    marked = {name for doc in documents() for block in blocks(doc) for name in block.names}
    samples = record(keep=options.keep)
    if options.show:
        print("\n\n".join(f"<!-- sample: {name} -->\n{text}" for name, text in samples.items()))
        return 0
    unknown = sorted(marked - set(samples))
    if unknown:
        print(f"the docs name samples the story does not record: {', '.join(unknown)}")
        return 1
    if options.check:
        stale = [
            block.where
            for doc in documents()
            for block in blocks(doc)
            if mask(block.text) != mask(expected(block, samples))
        ]
        print("\n".join(f"stale: {where}" for where in stale) or "every sample is current")
        return 1 if stale else 0
    for doc in documents():
        for where in rewrite(doc, samples, every=options.all):
            print(f"rewrote {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

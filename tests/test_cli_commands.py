"""Every operator command as a user runs it: a real process against a real database, the
logistics app loaded with --app, `--json` parsed, and each command's bad input refused with a
one-line error and exit 2 — with nothing written."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from oncebox import Box
from oncebox.examples.logistics.app import build_box, connect, create_tables
from oncebox.fakes.smtp_sink import SmtpSink
from oncebox.kernel.clock import ClockSetting
from oncebox.runtime.fanout import FanOut
from oncebox.store.params import JobFilter
from test_cli import assert_one_line_error, oncebox

POISON = 3
PERIOD = "2026-W33"


@pytest.fixture
def freight(tmp_path: Path):
    """A freight database with four active customers (one with a broken address) and one
    inactive, and the environment a user would export."""
    url = f"sqlite:///{tmp_path / 'freight.db'}"
    box = build_box(url)
    try:
        create_tables(box)
        conn = connect(box)
        for customer, active in [(1, 1), (2, 1), (3, 1), (4, 1), (5, 0)]:
            email = "broken@@example" if customer == POISON else f"ops{customer}@customer.example"
            conn.execute(
                "INSERT INTO freight_customers (id, name, email, active) VALUES (?, ?, ?, 1)",
                (customer, f"Customer {customer}", email),
            )
            conn.execute("UPDATE freight_customers SET active = ? WHERE id = ?", (active, customer))
        conn.commit()
        conn.close()
    finally:
        box.close()
    env = {
        "ONCEBOX_DB": url,
        "ONCEBOX_APP": "support.cli_freight",
        "ONCEBOX_EMAIL": f"file://{tmp_path / 'mail'}",
        "USER": "ops-alice",
        "ONCEBOX_SECRET": "cli-tests-secret-0123456789",
    }
    return url, env, tmp_path


def fan_outs_paused(url: str) -> None:
    """Pause the weekly digest's fan-outs, unaudited (no operator acted): the test's workers run
    the jobs it made and no others. Running, a worker's scheduler fans out the week due on the
    real clock — on a Monday within the schedule's grace after its 09:00 fire, the current one —
    beside the test's own PERIOD; a period run by hand (`schedule run`) is not held back."""
    box = build_box(url)
    try:
        box.pause_schedule("weekly-digest")
    finally:
        box.close()


def run(env, *args, cwd=None):
    return oncebox(*args, env=env, cwd=cwd)


def ok_json(result):
    assert result.returncode == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def job_count(url: str) -> int:
    box = Box(url)
    try:
        return len(box.store.job_list(JobFilter(limit=1000)))
    finally:
        box.close()


def test_enqueue_parses_values_as_json_and_reports_a_held_key(freight):
    _url, env, _tmp = freight
    first = ok_json(
        run(env, "enqueue", "weekly_digest", "customer_id=1", f"period={PERIOD}", "--json")
    )
    assert first["created"] is True
    assert first["key"] == f"weekly-digest/customer-1/{PERIOD}"
    again = ok_json(
        run(env, "enqueue", "weekly_digest", "customer_id=1", f"period={PERIOD}", "--json")
    )
    assert (again["created"], again["reason"], again["job_id"]) == (
        False,
        "active_job",
        first["job_id"],
    )
    text = run(env, "enqueue", "weekly_digest", "customer_id=1", f"period={PERIOD}")
    assert f"held by job {first['job_id']} (ready)" in text.stdout
    # typed by the handler's annotations: 01 is the integer 1, so it is the same key
    padded = ok_json(
        run(env, "enqueue", "weekly_digest", "customer_id=01", f"period={PERIOD}", "--json")
    )
    assert (padded["key"], padded["created"]) == (first["key"], False)
    # a str parameter takes the text as typed, even when it looks like JSON
    text_period = ok_json(
        run(env, "enqueue", "weekly_digest", "customer_id=2", "period=42", "--json")
    )
    assert text_period["key"] == "weekly-digest/customer-2/42"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("weekly_digest", "customer_id", f"period={PERIOD}"), "not name=value"),
        (("weekly_digest", "customer_id=1", "customer_id=2"), "given twice"),
        (("no_such_task", "x=1"), "no_such_task"),
        (("weekly_digest", "customer_id=1.5", f"period={PERIOD}"), "is an int: '1.5'"),
        (("weekly_digest", "customer_id=abc", f"period={PERIOD}"), "is an int"),
        (("weekly_digest", "customer_id=1", f"period={PERIOD}", "--delay", "nan"), "--delay"),
        (
            (
                "weekly_digest",
                "customer_id=1",
                f"period={PERIOD}",
                "--run-at",
                "0001-01-01T00:00:00",
            ),
            "outside 1970-9000",
        ),
        (("weekly_digest", "customer_id=1"), "period"),
        (("weekly_digest", "customer_id=1", f"period={PERIOD}", "--delay", "-3"), "--delay"),
    ],
)
def test_enqueue_refuses_bad_input_and_writes_nothing(freight, args, needle):
    url, env, _tmp = freight
    result = run(env, "enqueue", *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert needle in result.stderr
    assert job_count(url) == 0


def test_commands_that_run_code_require_the_app(freight):
    _url, env, _tmp = freight
    env = {**env, "ONCEBOX_APP": ""}
    for args in (
        ("enqueue", "weekly_digest"),
        ("worker",),
        ("keys", "check"),
        ("schedule", "run", "weekly-digest", "--period", PERIOD),
    ):
        assert_one_line_error(run(env, *args), 2, "--app MODULE is required")


def test_a_schedule_run_then_worker_then_status_shows_the_periods_coverage(freight):
    url, env, tmp = freight
    listed = ok_json(run(env, "schedule", "list", "--json"))
    assert [(s["name"], s["cron"], s["period"], s["paused"]) for s in listed] == [
        ("weekly-digest", "0 9 * * MON", "iso_week", False)
    ]
    assert listed[0]["next_fire_at"].endswith("09:00:00Z")
    fan_outs_paused(url)  # PERIOD's coverage, not the week due now

    fan_out = ok_json(run(env, "schedule", "run", "weekly-digest", "--period", PERIOD, "--json"))
    assert (fan_out["eligible"], fan_out["enqueued"]) == (4, 4)
    again = ok_json(run(env, "schedule", "run", "weekly-digest", "--period", PERIOD, "--json"))
    assert (again["eligible"], again["enqueued"], again["already_claimed_or_active"]) == (4, 0, 4)

    worked = run(env, "worker", "--until-idle")
    assert worked.returncode == 0, worked.stderr
    assert "3 message(s) sent" in worked.stdout
    assert len(list((tmp / "mail").glob("*.eml"))) == 3

    status = ok_json(run(env, "status", "--json"))
    assert status["jobs"]["done"] == 3
    assert status["jobs"]["dead"] == 1
    assert status["dead"] == 1
    assert status["outbox"]["sent"] == 3
    [schedule] = status["schedules"]
    [period] = schedule["periods"]
    assert (period["period"], period["eligible"], period["covered"], period["sent"]) == (
        PERIOD,
        4,
        3,
        3,
    )
    assert (period["dead"], period["pending"], period["coverage"]) == (1, 0, 0.75)
    text = run(env, "status")
    assert "75.0%" in text.stdout
    assert "1 dead (oncebox dlq list)" in text.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("schedule", "run", "weekly-digest", "--period", "2026-W99"), "2026 has 53 ISO weeks"),
        (("schedule", "run", "weekly-digest", "--period", "2026-08-10"), "2026-08-10"),
        (("schedule", "run", "monthly", "--period", PERIOD), "monthly"),
        (("schedule", "run", "weekly-digest"), "--period"),
        (("schedule", "pause", "monthly", "--reason", "x"), "no schedule named 'monthly'"),
        (("schedule", "pause", "weekly-digest"), "--reason"),
    ],
)
def test_schedule_commands_refuse_bad_input(freight, args, needle):
    url, env, _tmp = freight
    result = run(env, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert job_count(url) == 0


DIED_AT = datetime(2026, 8, 10, 9, 0, tzinfo=UTC)
DEAD_OWNER = "vm-7:4242:manual"


def died_with_the_store(url: str) -> None:
    """A manual fan-out of PERIOD that died with the store right after its claim: its run stays
    `running` under an owner that never renews again; the database's clock frozen then."""
    box = build_box(url)
    try:
        box.store.clock_set(ClockSetting(frozen_at=DIED_AT))
        schedule = box.schedules["weekly-digest"]
        box.store.schedule_state(schedule.name, schedule.grace)
        assert FanOut(box.runtime, DEAD_OWNER).claim(schedule, PERIOD, None, rescan=True).claimed
    finally:
        box.close()


def clock_at(url: str, at: datetime) -> None:
    box = Box(url)
    try:
        box.store.clock_set(ClockSetting(frozen_at=at))
    finally:
        box.close()


def test_status_names_a_fan_outs_gone_owner_and_schedule_run_takes_it_over(freight):
    url, env, _tmp = freight
    died_with_the_store(url)
    clock_at(url, DIED_AT + timedelta(seconds=10))
    alive = run(env, "status")
    assert f"owner {DEAD_OWNER} alive (renewed 10s ago)" in alive.stdout, alive.stdout
    assert "fan-out(s) whose owner is gone" not in alive.stdout
    refused = run(env, "schedule", "run", "weekly-digest", "--period", PERIOD)
    assert_one_line_error(refused, 2, "a fan-out is running now")
    live = run(
        env, "schedule", "run", "weekly-digest", "--period", PERIOD, "--take-over", "--reason", "x"
    )
    assert_one_line_error(live, 2, f"its owner {DEAD_OWNER} is alive")

    clock_at(url, DIED_AT + timedelta(minutes=1))
    status = ok_json(run(env, "status", "--json"))
    assert status["fan_outs"] == [
        {
            "schedule": "weekly-digest",
            "period": PERIOD,
            "owner": DEAD_OWNER,
            "owner_live": False,
            "renewed_at": "2026-08-10T09:00:00Z",
            "lease_ends_at": "2026-08-10T09:05:00Z",
        }
    ], status["fan_outs"]
    text = run(env, "status").stdout
    assert (
        f"  weekly-digest {PERIOD}: owner {DEAD_OWNER} gone (last renewed 60s ago); its lease "
        "ends 2026-08-10T09:05:00Z (in 4m); take it over now: oncebox schedule run "
        f"weekly-digest --period {PERIOD} --take-over --reason ..."
    ) in text, text
    assert "1 fan-out(s) whose owner is gone" in text, text
    refused = run(env, "schedule", "run", "weekly-digest", "--period", PERIOD)
    assert_one_line_error(refused, 2, f"its owner {DEAD_OWNER} is gone", "--take-over")

    taken = run(
        env,
        "schedule",
        "run",
        "weekly-digest",
        "--period",
        PERIOD,
        "--take-over",
        "--reason",
        "the store restarted under it",
    )
    assert taken.returncode == 0, taken.stderr
    assert taken.stdout.splitlines() == [
        f"weekly-digest {PERIOD}: taken over from {DEAD_OWNER}, gone (last renewed 60s ago); "
        "its lease ends 2026-08-10T09:05:00Z (in 4m); audit #1",
        f"weekly-digest {PERIOD}: 4 eligible, 4 enqueued, 0 already claimed or active",
    ], taken.stdout
    [audit] = ok_json(run(env, "audit", "list", "--json"))
    assert (audit["action"], audit["actor"], audit["reason"]) == (
        "take-over",
        "ops-alice",
        "the store restarted under it",
    ), audit
    assert ok_json(run(env, "status", "--json"))["fan_outs"] == []
    again = run(
        env, "schedule", "run", "weekly-digest", "--period", PERIOD, "--take-over", "--reason", "x"
    )
    assert_one_line_error(again, 2, f"no fan-out of {PERIOD} is running")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--take-over",), "Missing option '--reason'"),
        (("--take-over", "--reason", " "), "a reason is required"),
        (("--reason", "why"), "--reason goes with --take-over"),
    ],
)
def test_schedule_run_take_over_refuses_bad_input(freight, args, needle):
    url, env, _tmp = freight
    result = run(env, "schedule", "run", "weekly-digest", "--period", PERIOD, *args)
    assert_one_line_error(result, 2, needle)
    assert job_count(url) == 0


def test_pausing_a_schedule_shows_in_the_list_is_audited_and_resume_clears_it(freight):
    _url, env, _tmp = freight
    paused = run(env, "schedule", "pause", "weekly-digest", "--reason", "customer migration")
    assert paused.returncode == 0, paused.stderr
    assert ok_json(run(env, "schedule", "list", "--json"))[0]["paused"] is True
    assert run(env, "schedule", "resume", "weekly-digest", "--reason", "done").returncode == 0
    assert ok_json(run(env, "schedule", "list", "--json"))[0]["paused"] is False
    entries = ok_json(run(env, "audit", "list", "--key", "weekly-digest", "--json"))
    assert [(e["action"], e["target_kind"], e["reason"]) for e in entries] == [
        ("resume", "schedule", "done"),
        ("pause", "schedule", "customer migration"),
    ]


def test_a_period_run_by_hand_shows_in_status_without_the_app(freight):
    _url, env, _tmp = freight
    run(env, "schedule", "run", "weekly-digest", "--period", PERIOD)
    bare = {**env, "ONCEBOX_APP": ""}
    [schedule] = ok_json(run(bare, "status", "--json"))["schedules"]
    assert [p["period"] for p in schedule["periods"]] == [PERIOD]
    assert [s["name"] for s in ok_json(run(bare, "schedule", "list", "--json"))] == [
        "weekly-digest"
    ]


def test_a_ready_job_is_cancelled_with_an_audit_and_only_once(freight):
    _url, env, _tmp = freight
    run(env, "enqueue", "weekly_digest", "customer_id=1", f"period={PERIOD}", "--delay", "3600")
    key = f"weekly-digest/customer-1/{PERIOD}"
    cancelled = ok_json(run(env, "jobs", "cancel", key, "--reason", "customer left", "--json"))
    assert cancelled["key"] == key
    [job] = ok_json(run(env, "jobs", "list", "--state", "cancelled", "--json"))
    assert job["key"] == key
    [entry] = ok_json(run(env, "audit", "list", "--action", "cancel", "--json"))
    assert (entry["target_key"], entry["reason"]) == (key, "customer left")
    assert_one_line_error(run(env, "jobs", "cancel", key, "--reason", "again"), 2, "no job")
    assert run(env, "jobs", "cancel", key).returncode == 2  # no --reason


def dead_poison(url: str, env) -> str:
    """PERIOD fanned out by hand and worked: customer POISON's job dead, its key returned."""
    fan_outs_paused(url)
    run(env, "schedule", "run", "weekly-digest", "--period", PERIOD)
    assert run(env, "worker", "--until-idle").returncode == 0
    return f"weekly-digest/customer-{POISON}/{PERIOD}"


def test_jobs_list_and_show_find_the_dead_poison_with_its_error(freight):
    url, env, _tmp = freight
    key = dead_poison(url, env)
    dead = ok_json(run(env, "jobs", "list", "--state", "dead", "--json"))
    assert [(j["key"], j["schedule"], j["period"]) for j in dead] == [
        (key, "weekly-digest", PERIOD)
    ]
    assert "is not an address" in dead[0]["last_error"]
    by_schedule = ok_json(
        run(env, "jobs", "list", "--schedule", "weekly-digest", "--period", PERIOD, "--json")
    )
    assert len(by_schedule) == 4
    [shown] = ok_json(run(env, "jobs", "show", key, "--json"))
    assert shown["attempts"][-1]["outcome"] == "dead"
    assert run(env, "jobs", "list", "--state", "sleeping").returncode == 2
    assert_one_line_error(
        run(env, "jobs", "show", "weekly-digest/customer-99/2026-W33"), 2, "no job"
    )
    assert_one_line_error(run(env, "jobs", "show", "bad key"), 2, "invalid key")


def test_dlq_list_show_and_a_rate_limited_replay_all_keep_the_key_and_audit(freight):
    url, env, _tmp = freight
    key = dead_poison(url, env)
    [letter] = ok_json(run(env, "dlq", "list", "--json"))
    assert (letter["kind"], letter["key"]) == ("job", key)
    [shown] = ok_json(run(env, "dlq", "show", key, "--json"))
    assert "is not an address" in shown["last_error"]
    assert ok_json(run(env, "dlq", "list", "--kind", "delivery", "--json")) == []

    replayed = ok_json(
        run(
            env,
            "dlq",
            "replay",
            "--all",
            "--task",
            "weekly_digest",
            "--rate",
            "50",
            "--reason",
            "address fixed",
            "--json",
        )
    )
    assert [(r["kind"], r["id"], r["key"]) for r in replayed] == [("job", letter["id"], key)]
    [entry] = ok_json(run(env, "audit", "list", "--key", key, "--json"))
    assert (entry["action"], entry["actor"], entry["reason"]) == (
        "replay",
        "ops-alice",
        "address fixed",
    )
    assert ok_json(run(env, "jobs", "show", key, "--json"))[0]["state"] == "ready"
    assert ok_json(run(env, "dlq", "list", "--json")) == []
    again = run(env, "dlq", "replay", key, "--reason", "again")
    assert_one_line_error(again, 2, "is ready; only dead jobs can be replayed")


def test_dlq_filters_a_dry_run_and_a_discard_as_an_operator_runs_them(freight):
    url, env, _tmp = freight
    key = dead_poison(url, env)
    by_period = ok_json(run(env, "dlq", "list", "--period", PERIOD, "--json"))
    assert [r["key"] for r in by_period] == [key]
    assert ok_json(run(env, "dlq", "list", "--period", "2026-W34", "--json")) == []
    assert ok_json(run(env, "dlq", "list", "--error", "NOT AN ADDRESS", "--json")) != []
    assert ok_json(run(env, "dlq", "list", "--older-than", "1d", "--json")) == []

    dry = run(env, "dlq", "replay", "--all", "--period", PERIOD, "--newer-than", "1h", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    [header, line, summary] = dry.stdout.splitlines()
    assert header.split()[:3] == ["KIND", "ID", "KEY"]
    assert line.split()[:4] == ["job", str(by_period[0]["id"]), key, "weekly_digest"]
    assert "InvalidArguments: email recipient 'broken@@example'" in line  # its first line
    assert summary == "1 would be replayed; nothing was changed"
    assert ok_json(run(env, "audit", "list", "--json")) == []
    assert ok_json(run(env, "jobs", "show", key, "--json"))[0]["state"] == "dead"

    discarded = run(env, "dlq", "discard", key, "--reason", "customer 3 closed the account")
    assert discarded.returncode == 0, discarded.stderr
    assert "discarded: cancelled, its attempts kept, its key free" in discarded.stdout
    [entry] = ok_json(run(env, "audit", "list", "--action", "discard", "--json"))
    assert (entry["target_key"], entry["actor"]) == (key, "ops-alice")
    again = run(env, "dlq", "discard", str(by_period[0]["id"]), "--reason", "again")
    assert_one_line_error(again, 2, "is cancelled; only dead jobs can be discarded")
    assert len(ok_json(run(env, "audit", "list", "--json"))) == 1
    fresh = ok_json(
        run(env, "enqueue", "weekly_digest", f"customer_id={POISON}", f"period={PERIOD}", "--json")
    )
    assert (fresh["created"], fresh["key"]) == (True, key)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("dlq", "replay", "--reason", "x"), "not both and not neither"),
        (("dlq", "replay", "k/1", "--all", "--reason", "x"), "not both and not neither"),
        (("dlq", "replay", "k/1"), "--reason"),
        (("dlq", "replay", "k/1", "--task", "t", "--reason", "x"), "filter --all"),
        (("dlq", "replay", "k/1", "--reason", "x"), "no job or outbox row"),
        (("dlq", "replay", "--all", "--rate", "0", "--reason", "x"), "--rate"),
        (("dlq", "show", "k/1"), "no dead job or delivery"),
        (("dlq", "list", "--kind", "message"), "--kind"),
        (("dlq", "list", "--kind", "delivery", "--task", "t"), "--task selects dead jobs"),
        (("dlq", "replay", "--all", "--task", "t", "--channel", "c", "--reason", "x"), "--task"),
        (("dlq", "list", "--kind", "job", "--channel", "email"), "--channel selects"),
    ],
)
def test_dlq_commands_refuse_bad_input(freight, args, needle):
    _url, env, _tmp = freight
    result = run(env, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_an_ambiguous_smtp_send_is_listed_shown_and_resolved_with_an_audit(freight):
    url, env, _tmp = freight
    fan_outs_paused(url)
    with SmtpSink() as sink:
        sink.script("drop")  # the first message arrives; its acknowledgement is lost
        env = {**env, "ONCEBOX_EMAIL": sink.url}
        run(env, "enqueue", "weekly_digest", "customer_id=1", f"period={PERIOD}")
        worked = run(env, "worker", "--until-idle")
        assert worked.returncode == 0, worked.stderr
        assert len(sink.received) == 1
    stopped = worked.stdout.splitlines()[-1]
    assert stopped.endswith("; 0 message(s) sent, 1 held (ambiguous)"), worked.stdout
    [row] = ok_json(run(env, "outbox", "list", "--state", "ambiguous", "--json"))
    assert (row["to"], row["key"]) == (
        ["ops1@customer.example"],
        f"weekly-digest/customer-1/{PERIOD}",
    )
    [shown] = ok_json(run(env, "outbox", "show", row["key"], "--json"))
    assert shown["payload"]["subject"].startswith("Your shipments")
    assert [a["outcome"] for a in shown["attempts"]] == ["ambiguous"]

    assert_one_line_error(run(env, "outbox", "resolve", row["key"], "--reason", "x"), 2, "--sent")
    both = run(env, "outbox", "resolve", row["key"], "--sent", "--resend", "--reason", "x")
    assert_one_line_error(both, 2, "one of them")
    assert run(env, "outbox", "resolve", row["key"], "--sent").returncode == 2  # no --reason
    resolved = ok_json(
        run(
            env,
            "outbox",
            "resolve",
            row["key"],
            "--sent",
            "--receipt",
            "<abc@mx>",
            "--reason",
            "the customer has it",
            "--json",
        )
    )
    assert resolved["resolution"] == "sent"
    assert ok_json(run(env, "outbox", "show", str(row["id"]), "--json"))[0]["state"] == "sent"
    [entry] = ok_json(run(env, "audit", "list", "--action", "resolve-sent", "--json"))
    assert (entry["target_key"], entry["reason"]) == (row["key"], "the customer has it")
    assert_one_line_error(
        run(env, "outbox", "resolve", row["key"], "--resend", "--reason", "again"),
        2,
        "only ambiguous",
    )
    assert run(env, "outbox", "list", "--state", "lost").returncode == 2


def test_keys_check_and_accept_guard_a_drifted_deploy(freight):
    url, env, _tmp = freight
    dead_poison(url, env)  # the running app has recorded its canaries
    checked = ok_json(run(env, "keys", "check", "--json"))
    assert {(c["kind"], c["name"], c["status"]) for c in checked} == {
        ("task", "weekly_digest", "ok"),
        ("schedule", "weekly-digest", "ok"),
    }
    drifted = {**env, "ONCEBOX_APP": "support.cli_freight_drifted"}
    result = run(drifted, "keys", "check")
    assert result.returncode == 1
    assert "drifted" in result.stdout
    assert (
        "'weekly-digest/customer-{customer_id}/{period}' -> 'weekly-digest/{customer_id}/{period}'"
        in result.stdout
    )
    refused = run(drifted, "enqueue", "weekly_digest", "customer_id=9", f"period={PERIOD}")
    assert_one_line_error(refused, 1, "oncebox keys accept task:weekly_digest")
    assert job_count(url) == 4

    assert_one_line_error(run(drifted, "keys", "accept", "nope", "--reason", "x"), 2, "nope")
    assert run(drifted, "keys", "accept", "weekly_digest").returncode == 2  # no --reason
    accepted = ok_json(
        run(drifted, "keys", "accept", "weekly_digest", "--reason", "new key scheme", "--json")
    )
    assert accepted["accepted"] is True
    assert (
        run(
            drifted, "keys", "accept", "schedule:weekly-digest", "--reason", "Berlin office"
        ).returncode
        == 0
    )
    assert run(drifted, "keys", "check").returncode == 0
    assert ok_json(
        run(drifted, "enqueue", "weekly_digest", "customer_id=9", f"period={PERIOD}", "--json")
    )["created"]
    actions = [e["action"] for e in ok_json(run(env, "audit", "list", "--json"))]
    assert actions.count("accept-keys") == 2
    # the old code now refuses in its turn
    assert run(env, "keys", "check").returncode == 1


@pytest.mark.postgres
def test_status_and_dlq_on_postgresql(pg_url, tmp_path):
    box = build_box(pg_url)
    try:
        create_tables(box)
        conn = connect(box)
        conn.execute(
            "INSERT INTO freight_customers (id, name, email, active) "
            "VALUES (1, 'A', 'broken@@x', 1)"
        )
        conn.commit()
        conn.close()
    finally:
        box.close()
    env = {
        "ONCEBOX_SECRET": "cli-tests-secret-0123456789",
        "ONCEBOX_DB": pg_url,
        "ONCEBOX_APP": "support.cli_freight",
        "ONCEBOX_EMAIL": f"file://{tmp_path}",
    }
    run(env, "schedule", "run", "weekly-digest", "--period", PERIOD)
    assert run(env, "worker", "--until-idle").returncode == 0
    status = ok_json(run(env, "status", "--json"))
    assert status["schedules"][0]["periods"][0]["dead"] == 1
    assert len(ok_json(run(env, "dlq", "list", "--json"))) == 1
    replayed = ok_json(run(env, "dlq", "replay", "--all", "--reason", "r", "--json"))
    assert len(replayed) == 1


def test_a_worker_without_a_secret_stores_one_that_every_worker_then_shares(freight):
    url, env, tmp = freight
    fan_outs_paused(url)
    env = {**env, "ONCEBOX_SECRET": ""}
    run(env, "enqueue", "weekly_digest", "customer_id=1", f"period={PERIOD}")
    run(env, "enqueue", "weekly_digest", "customer_id=2", f"period={PERIOD}")
    assert run(env, "worker", "--until-idle").returncode == 0
    assert [j["state"] for j in ok_json(run(env, "jobs", "list", "--json"))] == ["done", "done"]
    box = Box(url)
    try:
        stored = box.store.setting_get("secret")
        assert stored is not None
        assert len(stored) >= 16
    finally:
        box.close()
    assert len(list((tmp / "mail").glob("*.eml"))) == 2


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("status", "--periods", "0"), "--periods"),
        (("audit", "list", "--limit", "0"), "--limit"),
        (("audit", "list", "--before", "yesterday"), "--before"),
        (("outbox", "show", "999"), "no message with id or key '999'"),
        (("outbox", "show", "bad key"), "invalid key"),
        (("jobs", "list", "--before", "x"), "--before"),
        (("schedule", "list", "--db", "mysql://x/y"), "mysql"),
        (("keys", "accept", "weekly_digest", "--reason", "   "), "reason"),
        (("audit", "list", "--key", "bad key"), "invalid key"),
        (("status", "--app", "", "--db", "sqlite:///no/such/file.db"), "no SQLite database"),
        (("frobnicate",), "No such command"),
    ],
)
def test_inspection_commands_refuse_bad_input(freight, args, needle):
    _url, env, _tmp = freight
    result = run(env, *args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_empty_listings_say_so_and_json_lists_are_empty(freight):
    _url, env, _tmp = freight
    for args, empty in [
        (("jobs", "list"), "no jobs"),
        (("dlq", "list"), "no dead letters"),
        (("outbox", "list"), "no messages"),
        (("audit", "list"), "no audit entries"),
    ]:
        result = run(env, *args)
        assert (result.returncode, result.stdout.strip()) == (0, empty)
        assert ok_json(run(env, *args, "--json")) == []


@pytest.mark.postgres
def test_operator_commands_on_an_unmigrated_postgresql_say_run_migrate(pg_template):
    from conftest import _admin, _url_for

    name = "oncebox_cli_unmigrated"
    with _admin() as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    try:
        env = {"ONCEBOX_DB": _url_for(name), "ONCEBOX_APP": ""}
        for args in (("status",), ("jobs", "list"), ("dlq", "list"), ("schedule", "list")):
            assert_one_line_error(run(env, *args), 1, "run `oncebox migrate`")
    finally:
        with _admin() as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name}")


def frozen_unsendable_message(url: str, env, monkeypatch) -> str:
    """A digest written by an older version that let a U+2028 into its subject: the job runs
    (consumer lane only), then its frozen row is edited as that version would have written it;
    the fan-outs paused, so that the test's workers run that key alone."""
    fan_outs_paused(url)
    for name in ("ONCEBOX_SECRET", "ONCEBOX_EMAIL"):
        monkeypatch.setenv(name, env[name])
    run(env, "enqueue", "weekly_digest", "customer_id=1", f"period={PERIOD}")
    box = build_box(url)
    try:
        consumer = box.consumer()
        try:
            assert consumer.run_once().completed == 1
        finally:
            consumer.session.close()
    finally:
        box.close()
    conn = connect_db(url)
    try:
        [(key, payload)] = conn.execute("SELECT key, payload FROM oncebox_outbox").fetchall()
        body = json.loads(payload)
        body["subject"] += "\u2028Bcc: everyone@example"
        conn.execute("UPDATE oncebox_outbox SET payload = ?", (json.dumps(body),))
        conn.commit()
    finally:
        conn.close()
    return str(key)


def connect_db(url: str):
    import sqlite3

    return sqlite3.connect(url.removeprefix("sqlite:///"))


def test_a_dead_message_no_provider_takes_is_discarded_and_its_job_replayed_under_the_same_key(
    freight, monkeypatch
):
    url, env, tmp = freight
    key = frozen_unsendable_message(url, env, monkeypatch)
    assert run(env, "worker", "--until-idle").returncode == 0
    [dead] = ok_json(run(env, "dlq", "list", "--kind", "delivery", "--json"))
    assert dead["key"] == key
    replay = ok_json(run(env, "dlq", "replay", key, "--reason", "try again", "--json"))
    assert [r["kind"] for r in replay] == ["delivery"]
    assert run(env, "worker", "--until-idle").returncode == 0
    [again] = ok_json(run(env, "dlq", "list", "--kind", "delivery", "--json"))
    assert again["key"] == key  # the frozen content fails the same way for ever

    assert run(env, "outbox", "discard", key).returncode == 2  # no --reason
    done = ok_json(
        run(env, "outbox", "discard", key, "--reason", "subject frozen unsendable", "--json")
    )
    assert (done["key"], done["intent_released"], done["kept"]) == (key, True, [])
    assert done["renamed"].startswith(f"{key}~discarded-")
    job = done["job_reopened"]
    [shown] = ok_json(run(env, "outbox", "show", key, "--json"))
    assert (shown["state"], shown["key"]) == ("discarded", done["renamed"])
    [entry] = ok_json(run(env, "audit", "list", "--action", "discard", "--json"))
    assert (entry["target_key"], entry["actor"], entry["reason"]) == (
        key,
        "ops-alice",
        "subject frozen unsendable",
    )
    twice = run(env, "outbox", "discard", key, "--reason", "twice")
    assert_one_line_error(twice, 2, "is discarded; only dead messages can be discarded")

    human = run(env, "dlq", "replay", str(job), "--reason", "subject fixed")
    assert human.returncode == 0, human.stderr
    assert run(env, "worker", "--until-idle").returncode == 0
    sent = ok_json(run(env, "outbox", "list", "--state", "sent", "--json"))
    assert [row["key"] for row in sent] == [key]
    assert ok_json(run(env, "dlq", "list", "--json")) == []
    mail = list((tmp / "mail").glob("*.eml"))
    assert len(mail) == 1 and "\u2028" not in mail[0].read_text(encoding="utf-8")


def test_a_message_that_may_have_been_delivered_is_not_discarded(freight):
    _url, env, _tmp = freight
    with SmtpSink() as sink:
        sink.script("drop")
        env = {**env, "ONCEBOX_EMAIL": sink.url}
        run(env, "enqueue", "weekly_digest", "customer_id=1", f"period={PERIOD}")
        assert run(env, "worker", "--until-idle").returncode == 0
    [row] = ok_json(run(env, "outbox", "list", "--state", "ambiguous", "--json"))
    refused = run(env, "outbox", "discard", row["key"], "--reason", "x")
    assert_one_line_error(refused, 2, "only dead")
    assert ok_json(run(env, "outbox", "show", row["key"], "--json"))[0]["state"] == "ambiguous"
    assert ok_json(run(env, "audit", "list", "--json")) == []


def test_a_duplicate_a_customer_reports_is_audited_and_counted(freight):
    _url, env, _tmp = freight
    run(env, "enqueue", "weekly_digest", "customer_id=1", f"period={PERIOD}")
    assert run(env, "worker", "--until-idle").returncode == 0
    key = f"weekly-digest/customer-1/{PERIOD}"
    reported = ok_json(
        run(
            env,
            "report-duplicate",
            key,
            "--reason",
            "customer forwarded both (ticket 4420)",
            "--json",
        )
    )
    assert reported["key"] == key
    [entry] = ok_json(run(env, "audit", "list", "--action", "report-duplicate", "--json"))
    assert (entry["target_key"], entry["id"]) == (key, reported["audit_id"])
    status = ok_json(run(env, "status", "--json"))
    assert status["counters"]["duplicates_reported"] == 1
    assert run(env, "report-duplicate", key).returncode == 2  # no --reason
    unknown = run(env, "report-duplicate", f"weekly-digest/customer-2/{PERIOD}", "--reason", "x")
    assert_one_line_error(unknown, 2, "no job or outbox row")

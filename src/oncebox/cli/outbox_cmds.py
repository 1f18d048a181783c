"""`oncebox outbox list|show|resolve|discard`: the messages jobs wrote, settling ambiguous sends,
and discarding a message no provider will take."""

from __future__ import annotations

import click

from oncebox import shapes
from oncebox.cli.common import (
    actor_option,
    app_option,
    before_option,
    box_for_admin,
    db_option,
    fail,
    id_or_key,
    is_id,
    json_option,
    limit_option,
    print_json,
    print_table,
    reason_option,
    reported,
    say,
)
from oncebox.deliveries.events import STAGES
from oncebox.jobs.keys import validate_key
from oncebox.kernel.errors import NotFound
from oncebox.kernel.inert import printable
from oncebox.status import OUTBOX_STATES
from oncebox.store.params import OutboxFilter
from oncebox.store.records import DiscardResult


def _recipients(to: object) -> str:
    return ", ".join(map(str, to)) if isinstance(to, list) else str(to)


@click.group()
def outbox() -> None:
    """Outbox messages: written in the job's transaction, sent by the dispatcher."""


@outbox.command("list")
@click.option("--state", type=click.Choice(OUTBOX_STATES))
@click.option("--channel")
@click.option(
    "--reported",
    "stage",
    type=click.Choice(STAGES),
    help="Only messages the provider's reports took this far (bounced, complained, …).",
)
@before_option
@limit_option()
@app_option
@db_option
@json_option
def outbox_list(
    *,
    state: str | None,
    channel: str | None,
    stage: str | None,
    before_id: int | None,
    limit: int,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Messages, newest first."""
    with reported():
        box = box_for_admin(app, db)
        rows = box.store.outbox_list(
            OutboxFilter(
                state=state,  # type: ignore[arg-type]
                channel=channel,
                before_id=before_id,
                limit=limit,
                reported=stage,
            )
        )
    shaped = [shapes.message(row) for row in rows]
    if as_json:
        print_json(shaped)
        return
    print_table(
        ["ID", "KEY", "CHANNEL", "STATE", "TO", "SUBJECT", "ATTEMPT", "LAST ERROR"],
        [
            [
                m["id"],
                m["key"],
                m["channel"],
                m["state"] + (f" ({m['reported']})" if m["reported"] else ""),
                _recipients(m["to"]),
                m["subject"],
                m["attempt"],
                m["last_error"],
            ]
            for m in shaped
        ],
        "no messages",
    )


@outbox.command("show")
@click.argument("key_or_id")
@app_option
@db_option
@json_option
def outbox_show(key_or_id: str, app: str | None, db: str | None, as_json: bool) -> None:
    """A message (by id), or a key's messages, with the frozen payload and every delivery
    attempt."""
    with reported():
        box = box_for_admin(app, db)
        if is_id(id_or_key(key_or_id, "message")):
            row = box.store.outbox_get(int(key_or_id))
            rows = [row] if row is not None else []
        else:
            validate_key(key_or_id.replace("~", "-"))  # a message key is its intent's, plus ~suffix
            rows = box.store.outbox_find_by_key(key_or_id)
        if not rows:
            raise NotFound(f"no message with id or key {key_or_id!r}")
        records = [
            shapes.message(
                r, box.store.delivery_attempt_list(r.id), box.store.provider_event_list(r.id)
            )
            for r in rows
        ]
    if as_json:
        print_json(records)
        return
    for m in records:
        say(
            f"message {m['id']}  {m['channel']}  key={m['key']}  state={m['state']}  "
            f"to={_recipients(m['to'])}  subject={m['subject']!r}"
        )
        if m["possible_duplicates"]:
            say(f"  possible duplicates: {m['possible_duplicates']}")
        if m["rescues"]:
            say(f"  leases run out with no outcome: {m['rescues']}")
        if m["payload_dropped_at"]:
            say(f"  content dropped by retention at {m['payload_dropped_at']} (receipt kept)")
        if m["state"] == "sent" and not m["attempts"]:
            say(f"  attempts pruned by retention; sent at {m['sent_at']}, receipt {m['receipt']}")
        for a in m["attempts"]:
            say(
                f"  attempt {a['attempt']}: {a['outcome']} at {a['finished_at']}"
                + (f": {a['error']}" if a["error"] else "")
                + (f" (receipt {a['receipt']})" if a["receipt"] else "")
            )
        if m["reported"]:
            say(f"  the provider reports it {m['reported']} (since {m['reported_at']})")
        for e in m["provider_events"]:  # the provider's text, one line each (a newline escaped)
            kind, event_id = printable(e["kind"]), printable(e["event_id"])
            say(
                f"  provider event {kind} {event_id} received at {e['received_at']}"
                + (f" (id {printable(e['provider_id'])})" if e["provider_id"] else "")
            )


@outbox.command("resolve")
@click.argument("key_or_id")
@click.option("--sent", is_flag=True, help="It arrived: record it as sent.")
@click.option("--resend", is_flag=True, help="It did not arrive: send it again.")
@click.option("--receipt", help="With --sent: the provider's message id, for the record.")
@reason_option
@actor_option
@app_option
@db_option
@json_option
def outbox_resolve(
    *,
    key_or_id: str,
    sent: bool,
    resend: bool,
    receipt: str | None,
    reason: str,
    actor: str,
    app: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Settle an ambiguous send after checking with the provider or the recipient. Audited."""
    if sent == resend:
        fail("say what happened: --sent (it arrived) or --resend (it did not), one of them", 2)
    resolution = "sent" if sent else "resend"
    if receipt and resolution != "sent":
        fail("--receipt goes with --sent", 2)
    with reported():
        box = box_for_admin(app, db)
        outcome = box.resolve(
            id_or_key(key_or_id, "message"),
            "sent" if resolution == "sent" else "resend",
            reason=reason,
            actor=actor,
            receipt=receipt,
        )
    if as_json:
        print_json(
            {
                "id": outcome.id,
                "key": outcome.key,
                "resolution": resolution,
                "audit_id": outcome.audit_id,
            }
        )
    else:
        done = "recorded as sent" if resolution == "sent" else "pending again, to be resent"
        say(f"message {outcome.id} ({outcome.key}) {done}; audit #{outcome.audit_id}")


@outbox.command("discard")
@click.argument("key_or_id")
@reason_option
@actor_option
@app_option
@db_option
@json_option
def outbox_discard(
    *, key_or_id: str, reason: str, actor: str, app: str | None, db: str | None, as_json: bool
) -> None:
    """Discard a dead message that will never be sent as frozen (content no provider takes),
    so its job can be re-run to write it afresh under the same key. Audited."""
    with reported():
        box = box_for_admin(app, db)
        done = box.discard(id_or_key(key_or_id, "message"), reason=reason, actor=actor)
    if as_json:
        print_json(shapes.discard(done))
        return
    say(f"message {done.id} ({done.key}) discarded; kept as {done.renamed}; audit #{done.audit_id}")
    say(discard_next_step(done))


def discard_next_step(done: DiscardResult) -> str:
    """What the operator does next: a discard frees the key only once the intent has nothing
    else standing, and re-sends nothing by itself."""
    if done.kept:
        standing = ", ".join(f"{key} ({state})" for key, state in done.kept)
        return (
            f"the intent {done.intent_key} stays claimed: {standing} still stand(s); "
            "nothing will re-send the discarded message"
        )
    if done.job_reopened is not None:
        return (
            f"job {done.job_reopened} is dead again: once its code is fixed, "
            f"'oncebox dlq replay {done.job_reopened}' re-runs it and writes the message afresh"
        )
    return (
        f"the key {done.intent_key} is free (no job of it is left to replay): "
        "enqueue the operation again to write the message afresh"
    )


@click.command("report-duplicate")
@click.argument("key_or_id")
@reason_option
@actor_option
@app_option
@db_option
@json_option
def report_duplicate(
    *, key_or_id: str, reason: str, actor: str, app: str | None, db: str | None, as_json: bool
) -> None:
    """Record that a recipient received a sent message twice, audited: it counts in the
    duplicate-send figures (`duplicates_reported`) beside the possible duplicates oncebox saw
    itself. The message is not changed and nothing is sent."""
    with reported():
        box = box_for_admin(app, db)
        done = box.report_duplicate(id_or_key(key_or_id, "message"), reason=reason, actor=actor)
    if as_json:
        print_json({"id": done.id, "key": done.key, "audit_id": done.audit_id})
        return
    say(f"message {done.id} ({done.key}) reported as received twice; audit #{done.audit_id}")

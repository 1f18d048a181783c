"""The console's read-only pages. Each reads through the same store code and definitions as the
CLI (`oncebox.status`, `oncebox.jobs.receipts`, the store's list statements, all served by indexes)
and renders; none computes a figure of its own."""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from oncebox.box import Box
from oncebox.console.batches import REPLAY_PER_SECOND, Batches
from oncebox.console.guard import PageFn, path_for
from oncebox.console.render import counted, noun, render
from oncebox.console.sessions import Session
from oncebox.console.trends import Trends
from oncebox.jobs.dead_letters import DeadFilter, DiscardPlan, Kind, ReplayPlan
from oncebox.jobs.keys import key_problem
from oncebox.jobs.receipts import receipt_chain
from oncebox.kernel.clock import monotonic
from oncebox.kernel.durations import parse_duration
from oncebox.kernel.errors import ConfigurationError, InvalidInput, InvalidKey
from oncebox.kernel.inert import printable
from oncebox.kernel.storable import MAX_ROW_ID, checked_text, row_id
from oncebox.status import (
    JOB_STATES,
    OUTBOX_STATES,
    Figures,
    PeriodFigures,
    status_data,
    store_depths,
)
from oncebox.store.params import AuditFilter, JobFilter, OutboxFilter
from oncebox.store.records import JobRow, JobState, OutboxRow, OutboxState

PAGE_SIZE = 50
UNDELIVERED_JOBS: tuple[JobState, ...] = ("ready", "leased", "relayed", "dead", "cancelled")
UNDELIVERED_MESSAGES: tuple[OutboxState, ...] = (
    "pending",
    "leased",
    "sending",
    "ambiguous",
    "dead",
)
BATCH_LIMIT = 1000  # rows a batch from the console may take, as the CLI's default


def box_of(request: Request) -> Box:
    box: Box = request.app.state.box
    return box


def _choice(request: Request, name: str, allowed: list[str]) -> str | None:
    value = request.query_params.get(name) or None
    return value if value is None or value in allowed else None


def _text_param(request: Request, name: str) -> str | None:
    value = (request.query_params.get(name) or "").strip()
    return checked_text(value[:200], f"the filter {name!r}") or None


def _before(request: Request) -> int | None:
    """The paging cursor: a row id, or nothing; anything else is refused (`refusing`)."""
    value = request.query_params.get("before", "").strip()
    if not value:
        return None
    found = row_id(value)
    if found is None:
        raise InvalidInput(
            f"before={printable(value[:40])!r} is not a row id (ASCII digits, at most {MAX_ROW_ID})"
        )
    return found


def refusing(handler: PageFn) -> PageFn:
    """`handler`, or — for input it refused (`InvalidInput`: a filter no store keeps, a cursor
    that is no row id) — a 400 page saying what is wrong, never a server error."""

    def checked(request: Request, session: Session) -> Response:
        try:
            return handler(request, session)
        except InvalidInput as exc:
            return render(request, session, "refused.html", status_code=400, error=str(exc))

    return checked


def figures_of(request: Request) -> tuple[Figures, dict[str, Any]]:
    """The schedules' period figures for a page, as of the store's depths the page reads now
    (`PeriodFigures.agreeing`), and what the page says of their age: how old, and whether jobs
    or messages moved since they were read (then they may disagree with the page's other
    figures)."""
    figures: PeriodFigures = request.app.state.figures
    asked = monotonic()
    depths = store_depths(box_of(request))
    latest = figures.agreeing(depths)
    behind = latest.at < asked and latest.depths != depths
    return latest, {"age_s": monotonic() - latest.at, "behind": behind}


def _overview(request: Request) -> dict[str, Any]:
    box = box_of(request)
    figures, figures_age = figures_of(request)
    status = status_data(box, periods=1, schedules=figures.schedules)
    alerts: list[str] = []
    if status["clock"]["mode"] != "real":
        alerts.append(
            f"The store's clock is {status['clock']['mode']} (set by {status['clock']['owner']}):"
            " every worker reads this time."
        )
    for task in status["unserved_tasks"]:
        waiting = task["waiting"]
        alerts.append(
            f"{counted(waiting, 'job')} of task {task['task']} {noun(waiting, 'waits', 'wait')} "
            "and no live worker runs it."
        )
    for quiet in status["quiet_limits"]:
        waiting = quiet["waiting"]
        alerts.append(
            f"{counted(waiting, 'job')} of task {quiet['task']} {noun(waiting, 'waits', 'wait')} "
            f"on limits no process has declared since {quiet['last_declared_at']}: freed from "
            f"{quiet['freed_at']} by a worker that runs the task without limits."
        )
    if status["past_lease"]["jobs"] or status["past_lease"]["messages"]:
        alerts.append(
            f"Leases past their deadline: {counted(status['past_lease']['jobs'], 'job')}, "
            f"{counted(status['past_lease']['messages'], 'message')} (a worker died or is stuck)."
        )
    for run in status["fan_outs"]:
        if not run["owner_live"]:
            alerts.append(
                f"The fan-out of {run['schedule']} {run['period']} has lost its owner "
                f"{run['owner']} (last renewed {run['renewed_at'] or 'never'}); its lease ends "
                f"{run['lease_ends_at']}. Take it over now: oncebox schedule run "
                f"{run['schedule']} --period {run['period']} --take-over --reason …"
            )
    return {"status": status, "alerts": alerts, "figures_age": figures_age}


def overview(request: Request, session: Session) -> Response:
    return render(request, session, "overview.html", **_overview(request))


def overview_tiles(request: Request, session: Session) -> Response:
    """The overview's figures alone, its tiles and its schedules' current periods read together:
    the page refreshes both in place at once (htmx, the schedules out of band)."""
    return render(request, session, "_overview_figures.html", **_overview(request))


def trends(request: Request, session: Session) -> Response:
    trends: Trends = request.app.state.trends
    return JSONResponse(trends.series())


def periods(request: Request, session: Session) -> Response:
    figures, figures_age = figures_of(request)
    return render(
        request, session, "periods.html", schedules=figures.schedules, figures_age=figures_age
    )


def period_detail(request: Request, session: Session) -> Response:
    """A period's subjects not delivered yet, and why: its jobs not done (waiting, running, dead,
    cancelled, with their last error), and the messages of its jobs not sent (pending, held,
    dead)."""
    box = box_of(request)
    schedule = checked_text(request.path_params["schedule"], "the schedule's name")
    period = checked_text(request.path_params["period"], "the period")
    jobs: list[JobRow] = []
    for state in UNDELIVERED_JOBS:
        jobs += box.store.job_list(
            JobFilter(state=state, schedule=schedule, period=period, limit=PAGE_SIZE)
        )
    messages: list[OutboxRow] = []
    for message_state in UNDELIVERED_MESSAGES:
        messages += box.store.outbox_list(
            OutboxFilter(state=message_state, period=period, limit=PAGE_SIZE)
        )
    jobs.sort(key=lambda row: row.id, reverse=True)
    messages.sort(key=lambda row: row.id, reverse=True)
    return render(
        request,
        session,
        "period.html",
        schedule=schedule,
        period=period,
        jobs=jobs[:PAGE_SIZE],
        messages=messages[:PAGE_SIZE],
    )


def jobs(request: Request, session: Session) -> Response:
    box = box_of(request)
    where = JobFilter(
        state=cast(JobState | None, _choice(request, "state", JOB_STATES)),
        task=_text_param(request, "task"),
        queue=_text_param(request, "queue"),
        schedule=_text_param(request, "schedule"),
        period=_text_param(request, "period"),
        key_prefix=_text_param(request, "key_prefix"),
        before_id=_before(request),
        limit=PAGE_SIZE,
    )
    rows = box.store.job_list(where)
    return render(
        request,
        session,
        "jobs.html",
        jobs=rows,
        where=where,
        states=JOB_STATES,
        next_before=rows[-1].id if len(rows) == PAGE_SIZE else None,
    )


def outbox(request: Request, session: Session) -> Response:
    box = box_of(request)
    where = OutboxFilter(
        state=cast(OutboxState | None, _choice(request, "state", OUTBOX_STATES)),
        channel=_text_param(request, "channel"),
        period=_text_param(request, "period"),
        key_prefix=_text_param(request, "key_prefix"),
        before_id=_before(request),
        limit=PAGE_SIZE,
    )
    rows = box.store.outbox_list(where)
    return render(
        request,
        session,
        "outbox.html",
        messages=rows,
        where=where,
        states=OUTBOX_STATES,
        next_before=rows[-1].id if len(rows) == PAGE_SIZE else None,
    )


def key_search(request: Request, session: Session) -> Response:
    key = _text_param(request, "key")
    if key is None:
        return render(request, session, "key.html", chain=None, key=None, error=None)
    problem = key_problem(key.split("~", 1)[0])
    if problem is not None:  # never put an invalid key into a URL
        return render(
            request, session, "key.html", chain=None, key=key, error=problem, status_code=400
        )
    return RedirectResponse(path_for(request, "key", key=key), status_code=303)


def key_page(request: Request, session: Session) -> Response:
    key = request.path_params["key"]
    try:
        chain = receipt_chain(box_of(request).store, key)
    except (ConfigurationError, InvalidKey) as exc:
        return render(
            request, session, "key.html", chain=None, key=key, error=str(exc), status_code=400
        )
    return render(request, session, "key.html", chain=chain, key=key, error=None)


FILTER_FIELDS = ("kind", "task", "channel", "error", "period", "older_than", "newer_than")


def dead_filter(request: Request, limit: int) -> DeadFilter:
    """The dead letters the page's filter form names; a mistake is a ConfigurationError."""
    older, newer = _text_param(request, "older_than"), _text_param(request, "newer_than")
    return DeadFilter(
        kind=cast(Kind | None, _choice(request, "kind", ["job", "delivery"])),
        task=_text_param(request, "task"),
        channel=_text_param(request, "channel"),
        error=_text_param(request, "error"),
        period=_text_param(request, "period"),
        older_than=None if older is None else parse_duration(older, "older than"),
        newer_than=None if newer is None else parse_duration(newer, "newer than"),
        limit=limit,
    )


def _filter_query(request: Request) -> str:
    kept = {k: v for k, v in request.query_params.items() if k in FILTER_FIELDS and v.strip()}
    return urlencode(kept)


def dead(request: Request, session: Session) -> Response:
    box = box_of(request)
    try:
        rows: list[Any] = box.dead_letters(dead_filter(request, PAGE_SIZE))
        error = None
    except ConfigurationError as exc:
        rows, error = [], str(exc)
    return render(
        request,
        session,
        "dead.html",
        status_code=200 if error is None else 400,
        rows=rows,
        error=error,
        query=_filter_query(request),
        fields={k: request.query_params.get(k, "") for k in FILTER_FIELDS},
    )


def dead_plan(request: Request, session: Session) -> Response:
    """A dry run: exactly what a batch would replay or discard, kept for the confirmation."""
    box = box_of(request)
    verb = "discard" if request.query_params.get("do") == "discard" else "replay"
    try:
        where = dead_filter(request, BATCH_LIMIT)
        plan: ReplayPlan | DiscardPlan = (
            box.plan_discard(where) if verb == "discard" else box.plan_replay(where)
        )
    except ConfigurationError as exc:
        return render(
            request,
            session,
            "dead.html",
            rows=[],
            error=str(exc),
            status_code=400,
            query=_filter_query(request),
            fields={k: request.query_params.get(k, "") for k in FILTER_FIELDS},
        )
    batches: Batches = request.app.state.batches
    plan_id = batches.keep(session.id, plan) if session.may_act and plan.count else None
    return render(
        request,
        session,
        "dead_plan.html",
        plan=plan,
        verb=verb,
        plan_id=plan_id,
        query=_filter_query(request),
        per_second=REPLAY_PER_SECOND,
    )


def dead_batch(request: Request, session: Session) -> Response:
    batches: Batches = request.app.state.batches
    batch = batches.get(request.path_params["batch"])
    if batch is None:
        return render(request, session, "dead_batch.html", batch=None, status_code=404)
    template = "_batch.html" if "progress" in request.query_params else "dead_batch.html"
    return render(request, session, template, batch=batch)


def held(request: Request, session: Session) -> Response:
    box = box_of(request)
    rows = box.store.outbox_list(
        OutboxFilter(state="ambiguous", before_id=_before(request), limit=PAGE_SIZE)
    )
    return render(
        request,
        session,
        "held.html",
        messages=rows,
        next_before=rows[-1].id if len(rows) == PAGE_SIZE else None,
    )


def audit(request: Request, session: Session) -> Response:
    box = box_of(request)
    where = AuditFilter(
        key=_text_param(request, "key"),
        action=_text_param(request, "action"),
        before_id=_before(request),
        limit=PAGE_SIZE,
    )
    rows = box.store.audit_search(where)
    return render(
        request,
        session,
        "audit.html",
        rows=rows,
        where=where,
        next_before=rows[-1].id if len(rows) == PAGE_SIZE else None,
    )

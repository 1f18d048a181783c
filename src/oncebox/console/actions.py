"""The console's changes, each through `oncebox.runtime.operations` as the CLI's, audited in the
same transaction as the change with the logged-in user as the actor. Each answers with a redirect to
where its result shows and a notice of what happened (or why nothing did)."""

from __future__ import annotations

from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from oncebox.console.batches import Batches
from oncebox.console.guard import path_for, sessions_of
from oncebox.console.pages import box_of
from oncebox.console.sessions import Session
from oncebox.kernel.errors import ConfigurationError, InvalidInput, InvalidState, NotFound
from oncebox.kernel.storable import beyond_ids, checked_text, is_digits, row_id


def _choice(form: Any, name: str) -> str:
    """A field compared, never stored (a choice, a plan's id, where to go back to), trimmed."""
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


def _field(form: Any, name: str) -> str:
    """A text field, trimmed; text no store keeps is refused (`InvalidInput`: the action says
    "Nothing …" and why)."""
    value = form.get(name)
    return checked_text(value.strip(), f"the {name}") if isinstance(value, str) else ""


def _back(request: Request, form: Any, fallback: str) -> str:
    """Where to go after the action: the form's `back` path when it is one of this console's
    own paths, else `fallback` (never an address the form could point elsewhere)."""
    back = _choice(form, "back")
    root = request.scope.get("root_path") or ""
    if back.startswith(root + "/") and not back.startswith("//") and "\\" not in back:
        return back
    return fallback


def _kind(form: Any) -> Literal["job", "delivery"]:
    return "delivery" if _choice(form, "kind") == "delivery" else "job"


def _target(form: Any) -> int:
    value = _field(form, "id")
    if not is_digits(value):
        raise ConfigurationError("the form names no row")
    found = row_id(value)
    if found is None:
        raise NotFound(f"no row with id {beyond_ids(value)}")
    return found


def _done(request: Request, session: Session, where: str, level: str, text: str) -> Response:
    sessions_of(request).notify(session, level, text)
    return RedirectResponse(where, status_code=303)


def replay(request: Request, session: Session, form: Any) -> Response:
    box = box_of(request)
    where = _back(request, form, path_for(request, "dead"))
    try:
        kind = _kind(form)
        done = box.replay(
            _target(form), reason=_field(form, "reason"), actor=session.user, kind=kind
        )
    except (ConfigurationError, InvalidState, NotFound) as exc:
        return _done(request, session, where, "error", f"Nothing replayed: {exc}")
    what = "message" if done.kind == "delivery" else "job"
    state = "pending" if done.kind == "delivery" else "ready"
    return _done(
        request,
        session,
        where,
        "ok",
        f"Replayed {what} {done.id} ({done.key}): {state} again, same key; audit #{done.audit_id}.",
    )


def discard(request: Request, session: Session, form: Any) -> Response:
    """A dead job abandoned (cancelled, its key free again) or a dead message no provider takes
    discarded (its key kept aside), as `oncebox dlq discard` does."""
    box = box_of(request)
    where = _back(request, form, path_for(request, "dead"))
    try:
        done = box.discard_dead(
            _target(form), reason=_field(form, "reason"), actor=session.user, kind=_kind(form)
        )
    except (ConfigurationError, InvalidState, NotFound) as exc:
        return _done(request, session, where, "error", f"Nothing discarded: {exc}")
    if done.kind == "job":
        text = f"Discarded job {done.id} ({done.key}): cancelled, its key free again"
    elif done.discard is not None:
        text = f"Discarded message {done.id} ({done.key}), kept as {done.discard.renamed}"
    else:
        text = f"Discarded message {done.id} ({done.key})"
    return _done(request, session, where, "ok", f"{text}; audit #{done.audit_id}.")


def resolve(request: Request, session: Session, form: Any) -> Response:
    box = box_of(request)
    where = _back(request, form, path_for(request, "held"))
    resolution = _choice(form, "resolution")
    if resolution not in ("sent", "resend"):  # the form chooses neither in advance
        return _done(
            request,
            session,
            where,
            "error",
            "Nothing resolved: say whether the message arrived (record it as sent) or not "
            "(resend it, same key).",
        )
    try:
        done = box.resolve(
            _target(form),
            "sent" if resolution == "sent" else "resend",
            reason=_field(form, "reason"),
            actor=session.user,
            receipt=_field(form, "receipt") or None,
        )
    except (ConfigurationError, InvalidState, NotFound) as exc:
        return _done(request, session, where, "error", f"Nothing resolved: {exc}")
    result = "recorded as sent" if resolution == "sent" else "pending again, to be resent"
    return _done(
        request,
        session,
        where,
        "ok",
        f"Message {done.id} ({done.key}) {result}; audit #{done.audit_id}.",
    )


def run_batch(request: Request, session: Session, form: Any) -> Response:
    """Confirm a dry run: its plan, taken once, runs in the background; to its progress page."""
    batches: Batches = request.app.state.batches
    try:
        reason = _field(form, "reason")
    except InvalidInput as exc:
        return _done(request, session, path_for(request, "dead"), "error", f"Not run: {exc}")
    if not reason:
        return _done(request, session, path_for(request, "dead"), "error", "Give a reason.")
    plan = batches.take(session.id, _choice(form, "plan"))
    if plan is None:
        return _done(
            request,
            session,
            path_for(request, "dead"),
            "error",
            "That dry run is no longer kept (confirmed already, or too old): run it again.",
        )
    try:
        batch = batches.start(plan, user=session.user, reason=reason)
    except ConfigurationError as exc:
        return _done(request, session, path_for(request, "dead"), "error", str(exc))
    return RedirectResponse(path_for(request, "dead_batch", batch=batch.id), status_code=303)

"""Whatever a caller sends, no surface answers 5xx (issue 44, item 6), on both stores.

Hypothesis drives every route of the three web apps — read from the apps themselves, so a new
route is fuzzed as soon as it exists, and a route no request reached fails the test:

- the console, logged in as an operator: every GET route with arbitrary query parameters (the
  names its pages read, found in their source, and any others), every POST route with arbitrary
  form fields (urlencoded or multipart; the session's CSRF token and a fresh action id, or not);
- the HTTP API, with a key holding every scope: every operation with arbitrary path and query
  parameters, JSON bodies (NUL, lone surrogates as JSON escapes, bidi controls, huge numbers,
  deep nesting) or raw bytes, and arbitrary `Idempotency-Key` and `Content-Type` headers;
- the delivery receiver: arbitrary bodies — event-shaped JSON naming real messages, any JSON,
  any bytes — signed with the channel's secret, or not.

Text in a URL or a form cannot carry a lone surrogate (it is sent as UTF-8), so there it comes
as percent-encoded bytes that are not UTF-8 instead. Values are drawn among the seeded rows'
real ids, keys and names too, so requests reach the handlers' statements, not only their "not
found" branches. Each example sends one request to every route of its group; the examples are
the same on every run (`derandomize`); `ONCEBOX_FUZZ_EXAMPLES=300` raises their number and
`ONCEBOX_FUZZ_EXPLORE=1` draws new ones each run, to hunt (about 40 s for the suite's 40, on
one core for both stores).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
import secrets
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote_from_bytes

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from starlette.routing import BaseRoute, Mount, Route
from starlette.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from oncebox.api.app import endpoints
from oncebox.console import actions, login, pages
from oncebox.deliveries.events import KINDS
from oncebox.kernel import clock
from oncebox.providers.webhook_signatures import sign_webhook, signing_key
from oncebox.store.params import JobFilter, OutboxFilter
from support.reports import SECRET
from support.surfaces import CONSOLE, PERIOD, Surfaces, operator, seeded_surfaces

EXAMPLES = int(os.environ.get("ONCEBOX_FUZZ_EXAMPLES", "40"))
EXPLORE = os.environ.get("ONCEBOX_FUZZ_EXPLORE") == "1"  # new examples each run, to hunt
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not EXPLORE,  # the same examples on every run: CI is deterministic
    database=None,
    # no shrinking: the examples share a store whose rows they change, so a failure would not
    # replay the same; the first failing request is reported as it was sent
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),  # one store per module; examples share it
)


# -- recording which route answered -----------------------------------------------------------


class Recorder:
    """Wraps an app: for each request, the route the router matched (Starlette sets
    `scope["route"]`) and the status answered."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.routes: list[BaseRoute] = list(app.routes)
        self.reached: Counter[int] = Counter()  # id(route) -> requests its endpoint answered
        self.errors: list[tuple[str, str, int]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: list[int] = []

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        await self.app(scope, receive, sending)
        route = scope.get("route")
        if route is not None and status and status[0] != 405:
            self.reached[id(route)] += 1
        if status and status[0] >= 500:
            self.errors.append((scope["method"], scope["path"], status[0]))

    def unreached(self, routes: list[BaseRoute]) -> list[str]:
        return [describe(route) for route in routes if not self.reached[id(route)]]


def describe(route: BaseRoute) -> str:
    methods = sorted(getattr(route, "methods", None) or {"GET"})
    return f"{','.join(methods)} {getattr(route, 'path', route)}"


def methods_of(route: BaseRoute) -> list[str]:
    found = getattr(route, "methods", None)
    return sorted(found - {"HEAD"}) if found else ["GET"]


# -- values -----------------------------------------------------------------------------------

# What probes send: empty, zero, past every id, past every float, NUL, bidi and BOM, traversal,
# an escape already escaped, JSON's words, a template's braces, a header injection, markup.
HOSTILE = [
    "",
    " ",
    "0",
    "-1",
    "9" * 19,
    "9" * 23,
    "1" * 400,
    "1e309",
    "NaN",
    "\x00",
    "a\x00b",
    "\u202etxt.exe",
    "\ufeff",
    "../../etc/passwd",
    "%00",
    "%",
    "null",
    "{0}",
    "x" * 1000,
    "\r\nX-Injected: 1",
    "<script>alert(1)</script>",
]
# the same in JSON, where text may hold a lone surrogate, and numbers are numbers
JSON_HOSTILE = [*HOSTILE, "\ud800", "a\udfffb", 2**63, 2**63 - 1, -(2**63) - 1, 10**40, 1e308]
# any code point but a lone surrogate (a URL or a form carries UTF-8)
URL_CHARS = st.characters(codec="utf-8")
ANY_CHARS = st.characters(exclude_categories=())  # a lone surrogate too: JSON escapes it
HEADER_CHARS = st.characters(min_codepoint=0x20, max_codepoint=0xFF)  # what a header carries


def plain_text(alphabet: Any = URL_CHARS, max_size: int = 40) -> st.SearchStrategy[str]:
    return st.text(alphabet, max_size=max_size)


def numbers() -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(-(2**70), 2**70).map(str),
        st.integers(10**18, 10**40).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
    )


def values(seeded: list[str]) -> st.SearchStrategy[str | bytes]:
    """A parameter's value: a seeded name or id, a probe, a number, any text — or bytes that are
    not UTF-8 (percent-encoded as they are)."""
    hostile, found = st.sampled_from(HOSTILE), st.sampled_from(seeded)
    return st.one_of(
        hostile, hostile, found, found, numbers(), plain_text(), st.binary(max_size=20)
    )


def encoded(value: str | bytes, safe: str = "") -> str:
    """Percent-encoded for a URL, dots too (a client would resolve `..` before sending)."""
    raw = value if isinstance(value, bytes) else value.encode()
    return quote_from_bytes(raw, safe=safe).replace(".", "%2E")


def query_string(params: list[tuple[str, str | bytes]]) -> str:
    return "&".join(f"{encoded(name)}={encoded(value)}" for name, value in params)


def path_for(route: BaseRoute, draw: Callable[..., Any], seeded: list[str]) -> str:
    """A path the route matches, its parameters drawn (a `str` one holds no '/')."""
    if isinstance(route, Mount):
        return route.path + "/" + encoded(draw(values(seeded)), safe="/")
    assert isinstance(route, Route), route
    filled = {}
    for name, convertor in route.param_convertors.items():
        kind = type(convertor).__name__
        if kind in ("PathConvertor", "StringConvertor"):
            value = draw(values(seeded))
            raw = value if isinstance(value, bytes) else value.encode()
            if kind == "StringConvertor":
                raw = raw.replace(b"/", b"")
            filled[name] = encoded(raw or b"x", safe="/")
        else:  # a new convertor: draw what it converts
            pytest.fail(f"route {describe(route)}: no values for a {kind} parameter yet")
    return route.path_format.format(**filled)


def names_read(*modules: Any) -> list[str]:
    """The parameter and field names the modules read, from their source: a page that reads a
    new one has it fuzzed without a change here."""
    source = "\n".join(inspect.getsource(module) for module in modules)
    pattern = (
        r"(?:query_params\.get|form\.get|_text_param|_choice|_field|_raw)\(\s*"
        r"(?:request,\s*|form,\s*)?\"(\w+)\""
    )
    return sorted(set(re.findall(pattern, source)) | set(pages.FILTER_FIELDS) | {"before"})


def parameters(names: list[str], known: list[str]) -> st.SearchStrategy[list[tuple[Any, Any]]]:
    """Each of `names` or not, and up to two others, each with any value."""
    named = st.fixed_dictionaries({}, optional={name: values(known) for name in names})
    others = st.lists(st.tuples(plain_text(), values(known)), max_size=2)
    return st.tuples(named, others).map(lambda pair: [*pair[0].items(), *pair[1]])


def json_values(seeded: list[str]) -> st.SearchStrategy[Any]:
    hostile, found = st.sampled_from(JSON_HOSTILE), st.sampled_from(seeded)
    leaves = st.one_of(
        hostile,
        hostile,
        found,
        st.none(),
        st.booleans(),
        st.integers(-(10**40), 10**40),
        st.floats(allow_nan=False, allow_infinity=False),
        plain_text(ANY_CHARS),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(plain_text(ANY_CHARS), inner, max_size=4)
        ),
        max_leaves=12,
    )


def dumped(value: Any) -> bytes:
    """JSON text as a caller writes it: a lone surrogate as its `\\ud800` escape."""
    return json.dumps(value, ensure_ascii=True).encode()


# -- the stores -------------------------------------------------------------------------------


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def seeded(request: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Surfaces]:
    with seeded_surfaces(request.param, request, tmp_path_factory.mktemp("fuzz")) as found:
        yield found


def seeded_values(found: Surfaces) -> list[str]:
    """The seeded rows' ids, keys, tokens and names: values that find something."""
    store = found.box.store
    jobs = store.job_list(JobFilter(limit=20))
    messages = store.outbox_list(OutboxFilter(limit=20))
    return sorted(
        {str(row.id) for row in jobs}
        | {str(row.id) for row in messages}
        | {row.key for row in jobs if row.key}
        | {row.key for row in messages}
        | {row.token for row in messages}
        | {"weekly_digest", "weekly-digest", PERIOD, "email", "sent", "resend", "job", "delivery"}
        | {"dead", "ready", "ambiguous", "replay", "discard", "1d", "2h", "enqueue", "get-job"}
    )


@pytest.fixture
def no_error_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """A 5xx is one symptom; a traceback in the log is the other."""
    with caplog.at_level(logging.ERROR):
        yield
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not logged, [f"{r.name}: {r.getMessage()[:300]}" for r in logged]


def no_server_error(recorder: Recorder, routes: list[BaseRoute]) -> None:
    """No 5xx, and every route of the group answered by its endpoint at least once."""
    assert not recorder.errors, recorder.errors[:5]
    missed = recorder.unreached(routes)
    assert not missed, f"routes no request reached: {missed}"


def by_method(recorder: Recorder, method: str) -> list[BaseRoute]:
    """The routes taking `method`; a route taking neither GET nor POST fails the test, as no
    group here would fuzz it."""
    others = [describe(r) for r in recorder.routes if not {"GET", "POST"} & set(methods_of(r))]
    assert not others, f"routes no test here fuzzes: {others}"
    return [r for r in recorder.routes if method in methods_of(r)]


# -- the console ------------------------------------------------------------------------------


def test_no_console_route_answers_5xx_to_any_query(seeded, no_error_logged):
    recorder = Recorder(seeded.console)
    routes = by_method(recorder, "GET")
    names = names_read(pages, login)
    known = seeded_values(seeded)
    with TestClient(
        recorder, base_url=CONSOLE, follow_redirects=False, raise_server_exceptions=False
    ) as web:

        @FUZZ
        @given(st.data())
        def any_query(data: st.DataObject) -> None:
            operator(seeded.console, web)
            for route in routes:
                params = data.draw(parameters(names, known))
                path = path_for(route, data.draw, known)
                answer = web.get(f"{path}?{query_string(params)}")
                assert answer.status_code < 500, (path, params, answer.text[:500])

        any_query()
    no_server_error(recorder, routes)


def test_no_console_form_answers_5xx_whatever_its_fields(seeded, no_error_logged):
    recorder = Recorder(seeded.console)
    routes = by_method(recorder, "POST")
    # logging out ends the session the other forms use: it goes last
    routes.sort(key=lambda r: getattr(r, "name", "") == "logout")
    names = names_read(actions, login)
    known = seeded_values(seeded)
    with TestClient(
        recorder, base_url=CONSOLE, follow_redirects=False, raise_server_exceptions=False
    ) as web:

        @FUZZ
        @given(st.data())
        def any_form(data: st.DataObject) -> None:
            csrf = operator(seeded.console, web)
            nonce = secrets.token_urlsafe(8)
            web.cookies.set("oncebox_login", nonce)
            for route in routes:
                fields = dict(data.draw(parameters(names, known)))
                guards = {  # mostly right: the handler behind them is what is fuzzed
                    "csrf": data.draw(st.sampled_from([csrf] * 5 + ["", "x" * 40])),
                    "action_id": data.draw(
                        st.sampled_from([secrets.token_urlsafe(16)] * 5 + ["short"])
                    ),
                    "login_csrf": data.draw(st.sampled_from([nonce] * 5 + ["other"])),
                }
                form = {**guards, **fields} if data.draw(st.booleans()) else {**fields, **guards}
                path = path_for(route, data.draw, known)
                # a header is bytes: ISO 8859-1 as HTTP reads it
                headers = {b"origin": data.draw(st.sampled_from([CONSOLE] * 5 + ["null"])).encode()}
                referer = data.draw(  # read when Origin is null: any text a header may carry
                    st.one_of(
                        st.sampled_from([f"{CONSOLE}/dead", "http://[", "http://a]b/"]),
                        st.text(HEADER_CHARS, max_size=80),
                    )
                )
                if data.draw(st.booleans()):
                    headers[b"referer"] = referer.encode("latin-1")
                if data.draw(st.booleans()):
                    body = "&".join(f"{encoded(k)}={encoded(v)}" for k, v in form.items())
                    headers[b"content-type"] = b"application/x-www-form-urlencoded"
                    answer = web.post(path, content=body, headers=headers)
                else:  # multipart: a field may be a file
                    files = {
                        str(k): (None, v if isinstance(v, bytes) else v.encode())
                        for k, v in form.items()
                    }
                    answer = web.post(path, files=files or {"x": (None, b"")}, headers=headers)
                assert answer.status_code < 500, (path, form, answer.text[:500])

        any_form()
    no_server_error(recorder, routes)


# -- the HTTP API -----------------------------------------------------------------------------


def api_bodies(known: list[str]) -> st.SearchStrategy[bytes]:
    """A body: any JSON, JSON shaped as a route reads it (its fields' values any), or bytes."""
    anything = json_values(known)
    shaped = st.one_of(
        st.fixed_dictionaries(
            {"args": st.fixed_dictionaries({"customer_id": anything, "period": anything})},
            optional={"run_at": anything, "delay": anything, "priority": anything},
        ),
        st.fixed_dictionaries(
            {
                "jobs": st.lists(
                    st.fixed_dictionaries({"customer_id": anything, "period": anything}),
                    max_size=3,
                )
            }
        ),
        st.fixed_dictionaries({"reason": anything}),
    )
    return st.one_of(
        anything.map(dumped),
        shaped.map(dumped),
        st.binary(max_size=64),
        st.sampled_from([b"1" * 5000, b"[" * 100_000, b'{"a": 1, "a": 2}', b"\xef\xbb\xbf{}"]),
    )


MEDIA_TYPES = [b"application/json", b"application/merge-patch+json", b"text/plain", b"\xff/json"]


def test_no_api_operation_answers_5xx_to_any_request(seeded, no_error_logged):
    recorder = Recorder(seeded.api)
    by_name = {getattr(r, "name", None): r for r in recorder.routes}
    operations = [(e, by_name[e.operation]) for e in endpoints()]
    assert len(operations) == len(recorder.routes), "a route the API does not declare"
    known = seeded_values(seeded)
    good = f"Bearer {seeded.token}"
    with TestClient(recorder, raise_server_exceptions=False) as api:

        @FUZZ
        @given(st.data())
        def any_request(data: st.DataObject) -> None:
            for endpoint, route in operations:
                names = st.one_of(st.sampled_from([*endpoint.query, "x"]), plain_text())
                params = data.draw(st.lists(st.tuples(names, values(known)), max_size=3))
                path = path_for(route, data.draw, known)
                authorization = data.draw(
                    st.sampled_from([good, good, good, "Bearer obx_1_nope", "Basic x"])
                )
                media = data.draw(
                    st.sampled_from(
                        ["application/json", "application/merge-patch+json", "text/plain"]
                    )
                )
                # a header is bytes: ISO 8859-1 as HTTP reads it
                headers = {
                    b"authorization": authorization.encode(),
                    b"content-type": media.encode(),
                }
                idempotency = data.draw(st.one_of(st.none(), st.text(HEADER_CHARS, max_size=300)))
                if idempotency is not None:
                    headers[b"idempotency-key"] = idempotency.encode("latin-1")
                body = data.draw(api_bodies(known)) if endpoint.takes_body else b""
                url = f"{path}?{query_string(params)}"
                answer = api.request(endpoint.method, url, content=body, headers=headers)
                assert answer.status_code < 500, (endpoint.operation, url, body[:200], answer.text)

        any_request()
    no_server_error(recorder, recorder.routes)


# -- the delivery receiver --------------------------------------------------------------------


def events(known: list[str]) -> st.SearchStrategy[Any]:
    """Event-shaped payloads naming real messages (their tokens), with any values beside."""
    anything = json_values(known)
    kinds, hostile = st.sampled_from(sorted(KINDS)), st.sampled_from(JSON_HOSTILE)
    text = st.one_of(kinds, kinds, hostile, hostile, plain_text(ANY_CHARS), anything)
    data = st.fixed_dictionaries(
        {},
        optional={
            "email_id": text,
            "tags": st.one_of(
                st.fixed_dictionaries({"oncebox": st.sampled_from(known)}),
                st.lists(st.fixed_dictionaries({"name": text, "value": text}), max_size=2),
                anything,
            ),
            "headers": st.one_of(
                st.lists(st.fixed_dictionaries({"name": text, "value": text}), max_size=2),
                anything,
            ),
        },
    )
    return st.fixed_dictionaries(
        {"type": text, "data": st.one_of(data, anything)},
        optional={"created_at": st.one_of(text, st.datetimes().map(lambda d: d.isoformat()))},
    )


def test_the_receiver_answers_no_signed_or_unsigned_body_with_5xx(seeded, no_error_logged):
    recorder = Recorder(seeded.receiver)
    [route] = recorder.routes
    known = seeded_values(seeded)
    key = signing_key(SECRET)
    with TestClient(recorder, raise_server_exceptions=False) as receiver:

        @FUZZ
        @given(st.data())
        def any_body(data: st.DataObject) -> None:
            for _ in range(4):
                body = data.draw(
                    st.one_of(
                        events(known).map(dumped),
                        events(known).map(dumped),
                        json_values(known).map(dumped),
                        st.binary(max_size=64),
                    )
                )
                event_id = data.draw(
                    st.one_of(
                        st.just(f"msg_{secrets.token_hex(6)}"),
                        st.text(
                            st.characters(min_codepoint=0x21, max_codepoint=0xFF),
                            min_size=1,
                            max_size=60,
                        ),
                    )
                )
                stamp = str(int(clock.real_now().timestamp()))
                signature = sign_webhook(key, event_id, stamp, body)
                headers = {
                    b"svix-id": event_id.encode("latin-1"),
                    b"svix-timestamp": data.draw(
                        st.sampled_from([stamp.encode()] * 8 + [b"1", b"x" * 13])
                    ),
                    b"svix-signature": data.draw(
                        st.sampled_from([signature.encode()] * 8 + [b"v1,x"])
                    ),
                }
                channel = data.draw(st.sampled_from(["email"] * 8 + ["sms", "%00"]))
                path = route.path_format.format(channel=channel)  # type: ignore[attr-defined]
                answer = receiver.post(path, content=body, headers=headers)
                assert answer.status_code < 500, (body[:300], headers, answer.text)

        any_body()
    no_server_error(recorder, recorder.routes)

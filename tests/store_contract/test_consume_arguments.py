"""Stored arguments at consume: a delivery whose arguments `encode_args` would never write (not
JSON, nested too deeply, NaN, a name given twice, the wrong shape, an unknown task) dies at
once with its problem named, and the rest of its batch completes; the worker keeps going.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oncebox.lanes.consumer as consumer_module
from oncebox import Box, Retry
from oncebox.jobs import codec
from oncebox.lanes.consumer import ConsumerResult
from oncebox.testing import RedeliveringTransport
from support.db import sql
from support.rows import job_row

SECRET = "test-secret-not-for-production"


def nested(levels: int, inner: str = "") -> str:
    return "[" * levels + inner + "]" * levels


# -- the consumer: a poison delivery dies alone, at once ---------------------------------------
def test_poison_deliveries_die_at_once_naming_their_problem_and_the_batch_completes(
    sqlite_url, open_box
):
    box = open_box(sqlite_url, seed=1234, secret=SECRET)
    ran: list[int] = []

    @box.task(key="h/{n}", retry=Retry(max_attempts=5))
    def hardened(ctx, n: int, note: Any = None) -> None:
        ran.append(n)

    poisons = {
        '{"n": 1, "note": ' + nested(10_000) + "}": "nested too deeply",
        '{"n": 2, "note": NaN}': "NaN is not a JSON value",
        '{"n": 3, "note": [1e400]}': "not finite",
        '{"n": 4, "n": 40}': "name 'n' twice",
        '{"n": 5, "note": {"a": 1, "a": 2}}': "name 'a' twice",
    }
    broker = RedeliveringTransport(copies=1)
    ids = {}
    for n, (text, needle) in enumerate(poisons.items(), start=1):
        message_id = broker.publish("hardened", n=n)
        broker._messages[message_id].args_json = text
        ids[message_id] = needle
    good = broker.publish("hardened", n=99)
    consumer = box.consumer(transport=broker)
    try:
        result = consumer.run_once()  # must not raise
    finally:
        consumer.session.close()
    acks = dict(broker.acks)
    assert acks == {**dict.fromkeys(ids, "dead"), good: "completed"}, acks
    assert ran == [99]
    assert (result.dead, result.completed, result.retried) == (len(poisons), 1, 0)
    errors = sorted(failure.error for failure in result.failures)
    for needle in ids.values():
        assert any(needle in e and "InvalidArguments" in e for e in errors), (needle, errors)
    assert all(failure.final for failure in result.failures)


def test_an_unexpected_error_while_preparing_a_delivery_kills_only_that_delivery(
    sqlite_url, open_box, monkeypatch
):
    """Preparing reads only the delivery, so an error there would recur on every attempt:
    the delivery is dead at once, instead of its whole batch being released and fetched again."""
    box = open_box(sqlite_url, seed=1234, secret=SECRET)
    ran: list[int] = []

    @box.task(key="h/{n}")
    def hardened(ctx, n: int) -> None:
        ran.append(n)

    real = codec.parse_args

    def flaky(text: Any) -> dict[str, Any]:
        if '"n":1' in str(text):
            raise RuntimeError("a bug in preparing")
        return real(text)

    monkeypatch.setattr(consumer_module, "parse_args", flaky)
    broker = RedeliveringTransport(copies=1)
    bad, good = broker.publish("hardened", n=1), broker.publish("hardened", n=2)
    consumer = box.consumer(transport=broker)
    try:
        result = consumer.run_once()
    finally:
        consumer.session.close()
    assert dict(broker.acks) == {bad: "dead", good: "completed"}
    assert ran == [2]
    [failure] = result.failures
    assert failure.final and "RuntimeError: a bug in preparing" in failure.error


@pytest.fixture
def sqlite_box(sqlite_url, open_box) -> Box:
    """For what does not depend on the store (the broker path, decoding): SQLite only."""
    box: Box = open_box(sqlite_url, seed=1234, secret=SECRET)
    return box


def declare_victim(box: Box, ran: list[tuple[Any, ...]]) -> None:
    @box.task(key="fuzz/{n}", name="fuzz_t", retry=Retry(max_attempts=5))
    def fuzz_t(ctx, n: int, note: Any = None) -> None:
        ran.append((n, note))


def consume_with_poison(
    box: Box, args_json: str, task: str = "fuzz_t"
) -> tuple[RedeliveringTransport, ConsumerResult]:
    """A broker delivers a corrupted message, then a good one (n=2); run the consumer until the
    broker is empty (or 4 rounds)."""
    broker = RedeliveringTransport(copies=1)
    poison = broker.publish("fuzz_t", n=1)
    good = broker.publish("fuzz_t", n=2)
    broker._messages[poison].args_json = args_json
    broker._messages[poison].task = task
    broker._ready[:] = [good, poison]  # the poison is fetched first
    consumer = box.consumer(transport=broker)
    result = ConsumerResult()
    try:
        for _ in range(4):
            if not broker.pending:
                break
            result.add(consumer.run_once())
    finally:
        consumer.session.close()
    return broker, result


BROKEN_STORED_ARGS = [
    ("not-json", "not json", "not JSON"),
    ("empty", "", "not JSON"),
    ("truncated", '{"n": 1', "not JSON"),
    ("trailing-garbage", '{"n": 1} x', "not JSON"),
    ("bom", '\ufeff{"n": 1}', "not JSON"),
    ("null", "null", "not a JSON object"),
    ("array", "[1]", "not a JSON object"),
    ("string", '"n=1"', "not a JSON object"),
    ("number", "5", "not a JSON object"),
    ("int-10^4-digits", '{"n": ' + "1" * 10**4 + "}", "not JSON"),
    ("int-as-string", '{"n": "1"}', "must be int, not str"),
    ("int-looking-float", '{"n": 1.0}', "must be int, not float"),
    ("int-overflowing-to-inf", '{"n": 1e400}', "must be int, not float"),
    ("extra-argument", '{"n": 1, "os": "system"}', "unexpected keyword argument 'os'"),
    ("missing-argument", '{"note": 1}', "missing a required argument: 'n'"),
    ("control-valid", '{"n": -1, "note": null}', None),  # valid: renders 'fuzz/-1' and runs
]


@pytest.mark.parametrize(
    ("args_json", "needle"),
    [pytest.param(a, n, id=i) for i, a, n in BROKEN_STORED_ARGS],
)
def test_a_delivery_with_broken_args_dies_at_once_and_the_next_job_completes(
    sqlite_box: Box, args_json, needle
):
    ran: list[tuple[Any, ...]] = []
    declare_victim(sqlite_box, ran)
    broker, result = consume_with_poison(sqlite_box, args_json)
    assert broker.pending == 0
    if needle is None:  # the control case: a valid message runs normally
        assert dict(broker.acks) == {"m1": "completed", "m2": "completed"}
        assert sorted(ran) == [(-1, None), (2, None)]
        return
    assert dict(broker.acks) == {"m1": "dead", "m2": "completed"}
    [failure] = result.failures
    assert failure.final and needle in failure.error, failure.error
    assert "InvalidArguments" in failure.error
    assert ran == [(2, None)]


@pytest.mark.parametrize("task", ["os.system", "builtins.eval", "subprocess.run"])
def test_a_delivery_of_an_unknown_task_dies_without_importing_anything(
    sqlite_box: Box, monkeypatch, task
):
    box = sqlite_box

    def explode(*_args: Any) -> int:
        raise AssertionError("a delivered task name was resolved as an import path")

    monkeypatch.setattr(os, "system", explode)
    ran: list[tuple[Any, ...]] = []
    declare_victim(box, ran)
    broker, result = consume_with_poison(box, '{"command": "touch /tmp/pwned"}', task=task)
    assert dict(broker.acks) == {"m1": "dead", "m2": "completed"}
    [failure] = result.failures
    assert f"UnknownTask: no task named {task!r}" in failure.error
    assert ran == [(2, None)]


@pytest.mark.parametrize("levels", [10**3, 10**4])
def test_a_delivery_with_deeply_nested_args_dies_at_once(sqlite_box: Box, levels):
    box = sqlite_box
    ran: list[tuple[Any, ...]] = []
    declare_victim(box, ran)
    broker, result = consume_with_poison(box, '{"n": 1, "note": ' + nested(levels) + "}")
    assert dict(broker.acks) == {"m1": "dead", "m2": "completed"}
    assert "InvalidArguments" in result.failures[0].error


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_delivery_with_a_non_finite_number_dies_at_once(sqlite_box: Box, literal):
    box = sqlite_box
    ran: list[tuple[Any, ...]] = []
    declare_victim(box, ran)
    broker, _result = consume_with_poison(box, '{"n": 1, "note": ' + literal + "}")
    assert dict(broker.acks) == {"m1": "dead", "m2": "completed"}
    assert ran == [(2, None)]


def test_a_delivery_with_duplicated_argument_names_dies_at_once(sqlite_box: Box):
    box = sqlite_box
    ran: list[tuple[Any, ...]] = []
    declare_victim(box, ran)
    broker, _result = consume_with_poison(box, '{"n": 1, "n": 3}')
    assert dict(broker.acks) == {"m1": "dead", "m2": "completed"}
    assert ran == [(2, None)]


def corrupt_stored_args(box: Box, job_id: int, args_json: str) -> None:
    cast = "?" if box.store.dialect == "sqlite" else "?::jsonb"
    sql(box, f"UPDATE oncebox_jobs SET args = {cast} WHERE id = ?", (args_json, job_id))


def run_worker_over_poison(box: Box, poisons: dict[str, str]) -> dict[int, str]:
    """Enqueue one job per poison (n=1..) and a good one (n=99), corrupt the poisons' stored
    args, run a real worker until idle; return {job id: needle} for the poisons."""
    ran: list[tuple[Any, ...]] = []
    declare_victim(box, ran)
    expected: dict[int, str] = {}
    for n, (args_json, needle) in enumerate(poisons.items(), start=1):
        job_id = box.enqueue("fuzz_t", n=n).job_id
        assert job_id is not None
        corrupt_stored_args(box, job_id, args_json)
        expected[job_id] = needle
    good = box.enqueue("fuzz_t", n=99).job_id
    result = box.work(until_idle=True)
    for job_id, needle in expected.items():
        dead = job_row(box, job_id)
        assert (dead.state, dead.attempt) == ("dead", 1), (job_id, dead.state)
        assert needle in (dead.last_error or ""), dead.last_error
    done = job_row(box, good)
    assert (done.state, done.outcome) == ("done", "completed")
    assert (result.consumed.dead, result.consumed.completed) == (len(poisons), 1)
    assert ran == [(99, None)]
    assert box.store.intent_count() == 1
    return expected


def test_stored_jobs_with_broken_args_are_dead_and_the_worker_keeps_going(box: Box):
    """Values a jsonb column can hold too, so both stores: each poison dies on its first
    attempt, naming its problem, and the worker completes the good job."""
    run_worker_over_poison(
        box,
        {
            "null": "not a JSON object",
            "[1]": "not a JSON object",
            '"text"': "not a JSON object",
            '{"n": "1"}': "must be int, not str",
            '{"n": 1, "extra": 2}': "unexpected keyword argument 'extra'",
        },
    )


@pytest.mark.parametrize(
    ("args_json", "needle"),
    [
        pytest.param("not json", "not JSON", id="not-json"),
        pytest.param('\ufeff{"n": 1}', "not JSON", id="bom"),
        pytest.param('{"n": ' + "9" * 10**4 + "}", "not JSON", id="int-10^4-digits"),
        pytest.param(
            '{"n": ' + nested(10**4) + "}",
            "InvalidArguments",
            id="deep-nesting",
        ),
    ],
)
def test_a_stored_text_that_is_not_json_is_dead_and_the_worker_keeps_going(
    sqlite_box: Box, args_json, needle
):
    """SQLite keeps args as text, so damage can be anything (PostgreSQL's jsonb refuses it)."""
    run_worker_over_poison(sqlite_box, {args_json: needle})


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["n", "note", "x", ""]), inner, max_size=3)
    ),
    max_leaves=8,
)


_STORED_ARGS = st.one_of(
    st.text(max_size=40),
    _JSON_VALUES.map(json.dumps),
    st.builds(lambda value, cut: json.dumps(value)[:cut], _JSON_VALUES, st.integers(0, 30)),
    st.sampled_from([a for _i, a, _n in BROKEN_STORED_ARGS]),
)


def test_any_stored_args_text_settles_its_delivery_and_costs_the_next_job_nothing(sqlite_url):
    box = Box(sqlite_url, secret=SECRET)
    ran: list[tuple[Any, ...]] = []
    declare_victim(box, ran)
    good_ids = itertools.count(10**6)
    try:

        @settings(max_examples=60, deadline=None)
        @given(_STORED_ARGS)
        def check(args_json: str) -> None:
            broker = RedeliveringTransport(copies=1)
            poison = broker.publish("fuzz_t", n=1)
            good = broker.publish("fuzz_t", n=next(good_ids))
            broker._messages[poison].args_json = args_json
            broker._ready[:] = [good, poison]
            consumer = box.consumer(transport=broker)
            try:
                consumer.run_once()
            finally:
                consumer.session.close()
            acks = dict(broker.acks)
            assert broker.pending == 0
            assert acks[good] == "completed"
            assert acks[poison] in {"dead", "completed", "duplicate"}

        check()
    finally:
        box.close()

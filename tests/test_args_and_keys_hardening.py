"""Arguments come back as they were written, and one operation renders one key.

Regression tests for the fuzz findings on job arguments and key templates
(tests/test_fuzz_inputs.py): stored arguments that `encode_args` would never write (nesting too
deep for the parser, NaN and Infinity, a name given twice) make that one delivery dead with its
problem named while the rest of the batch completes; arguments JSON would silently change (a
non-string mapping key, a lone surrogate) are refused at enqueue; a template whose segment holds
two placeholders is refused at declaration; keys are rendered from the arguments as stored; and
every template error is one printable line.
"""

from __future__ import annotations

import enum
import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import oncebox.queue.consumer as consumer_module
from oncebox import Box, Retry
from oncebox.errors import InvalidArguments, InvalidKey, KeyTemplateError
from oncebox.jobs.codec import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_DEPTH,
    check_finite,
    decode_args,
    encode_args,
    parse_args,
)
from oncebox.jobs.keys import KeyTemplate
from oncebox.testing import RedeliveringTransport

SECRET = "test-secret-not-for-production"


def nested(levels: int, inner: str = "") -> str:
    return "[" * levels + inner + "]" * levels


def jobs_written(box: Box) -> dict[str, int]:
    return box.store.job_count_by_state().counts


# -- decoding: what encode_args never writes is refused --------------------------------------


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 1_000, 100_000])
def test_stored_arguments_nested_too_deeply_are_invalid_arguments_not_a_recursion_error(levels):
    with pytest.raises(InvalidArguments, match="nested"):
        decode_args('{"n": 1, "note": ' + nested(levels) + "}")


def test_encoding_and_decoding_draw_the_depth_line_in_the_same_place():
    deepest = {"note": json.loads(nested(MAX_DEPTH))}
    assert decode_args(encode_args(deepest, "t", DEFAULT_MAX_PAYLOAD_BYTES)) == deepest
    with pytest.raises(InvalidArguments, match=f"nested deeper than {MAX_DEPTH}"):
        encode_args({"note": json.loads(nested(MAX_DEPTH + 1))}, "t", DEFAULT_MAX_PAYLOAD_BYTES)


@pytest.mark.parametrize(
    "number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", '[1, {"x": NaN}]']
)
def test_a_non_finite_number_anywhere_in_stored_arguments_is_refused(number):
    with pytest.raises(InvalidArguments, match=r"'note'|not a JSON value"):
        decode_args('{"n": 1, "note": {"deep": [' + number + "]}}")


def test_finite_extremes_round_trip():
    args = {"big": 1.7976931348623157e308, "tiny": 5e-324, "neg": -0.0, "int": 10**300}
    assert decode_args(encode_args(args, "t", DEFAULT_MAX_PAYLOAD_BYTES)) == args


def test_the_type_check_can_run_before_the_finiteness_check():
    """The consumer parses, checks the handler's types, then finiteness: `{"n": 1e400}` for an
    `n: int` then names the parameter's type rather than only the number."""
    parsed = parse_args('{"n": 1e400}')
    assert math.isinf(parsed["n"])
    with pytest.raises(InvalidArguments, match="'n' holds a number that is not finite"):
        check_finite(parsed)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ('{"n": 1, "n": 3}', "'n'"),
        ('{"n": 1, "note": {"a": 1, "b": 2, "a": 1}}', "'a'"),
        ('{"n": 1, "note": [{"x": [{"y": 1, "y": 1}]}]}', "'y'"),
    ],
)
def test_a_name_given_twice_at_any_depth_is_refused(text, name):
    with pytest.raises(InvalidArguments, match=f"name {name} twice"):
        decode_args(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"n": 1',
        b'{"n": "\xff"}',  # not UTF-8
        '{"n": ' + "1" * 5000 + "}",  # more digits than int() reads
    ],
)
def test_unreadable_stored_text_is_invalid_arguments(text):
    with pytest.raises(InvalidArguments, match="not JSON"):
        decode_args(text)


# -- encoding: what JSON would change or cannot carry is refused ------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"note": "\ud800"}, "'note'"),
        ({"note": ["ok", {"x": "a\udcffb"}]}, "'note'"),
        ({"note": {"\udcff": 1}}, "'note'"),
        ({"\ud800": 1}, "'\\\\ud800'"),
    ],
)
def test_a_lone_surrogate_is_invalid_arguments_naming_the_argument(args, named):
    with pytest.raises(InvalidArguments, match=f"argument {named} of task 'mail'") as caught:
        encode_args(args, "mail", DEFAULT_MAX_PAYLOAD_BYTES)
    assert str(caught.value).isascii() and "lone surrogate" in str(caught.value)


@pytest.mark.parametrize(
    "data", [{1: "x"}, {"ok": [{2.5: "x"}]}, {"ok": {"deeper": {None: 1}}}, {False: "x"}]
)
def test_a_nested_mapping_key_that_is_not_a_string_is_refused(data):
    with pytest.raises(InvalidArguments, match="argument 'data' of task 't' holds a mapping"):
        encode_args({"data": data}, "t", DEFAULT_MAX_PAYLOAD_BYTES)


class Region(str, enum.Enum):  # noqa: UP042 (a StrEnum's str() is its value: no bug to pin)
    EU = "eu"


class Shade(enum.IntEnum):
    DARK = 7


def test_two_mapping_keys_written_as_the_same_name_are_refused():
    class Loose(str):
        """Equal to nothing else, so a dict keeps it beside the plain "eu"."""

        def __eq__(self, other: object) -> bool:
            return self is other

        def __hash__(self) -> int:
            return id(self)

    with pytest.raises(InvalidArguments, match="two keys written as 'eu'"):
        encode_args({"data": {Loose("eu"): 1, "eu": 2}}, "t", DEFAULT_MAX_PAYLOAD_BYTES)


def test_enum_mapping_keys_and_values_are_stored_as_their_values():
    text = encode_args({"data": {Region.EU: Shade.DARK}}, "t", DEFAULT_MAX_PAYLOAD_BYTES)
    assert decode_args(text) == {"data": {"eu": 7}}


def test_refused_arguments_write_nothing(sqlite_url, open_box):
    box = open_box(sqlite_url)

    @box.task(key="p/{n}")
    def payload(ctx, n: int, data: Any = None) -> None:
        pass

    for data in ("\ud800", {"x": "\udcff"}, {1: "x"}, {"ok": [{None: 1}]}):
        with pytest.raises(InvalidArguments):
            box.enqueue(payload, n=1, data=data)
        with pytest.raises(InvalidArguments):
            box.enqueue_many(payload, [{"n": 2}, {"n": 3, "data": data}])
    assert jobs_written(box) == {}


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

    real = consumer_module.parse_args

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


# -- key templates ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "k/{x}{y}",
        "k/{x}-{y}",
        "k/pre-{x}.{y}-post",
        "{x}:{y}/k",
        "k/{x}/a{y}b{z}",
        "k/{x}{x}",
    ],
)
def test_a_template_with_two_placeholders_in_one_segment_is_refused(sqlite_url, open_box, template):
    with pytest.raises(KeyTemplateError, match="one placeholder per segment") as caught:
        KeyTemplate.parse(template)
    message = str(caught.value)
    assert message.isprintable() and "\n" not in message
    assert "share one segment" in message or "appears twice" in message

    box = open_box(sqlite_url)
    with pytest.raises(KeyTemplateError, match="one placeholder per segment"):

        @box.task(key=template)
        def pair(ctx, x: str, y: str = "", z: str = "") -> None:
            pass

    assert box.registry.names() == []


def test_the_refusal_shows_two_arguments_that_would_collide():
    with pytest.raises(KeyTemplateError) as caught:
        KeyTemplate.parse("k/{x}-{y}")
    assert "'{x}-{y}' reads 'a-b-c' for x='a-b', y='c' and for x='a', y='b-c'" in str(caught.value)


@pytest.mark.parametrize(
    "template", ["k/{x}/{y}", "k/a-{x}/b-{y}", "{x}/{y}", "k/{x}/{x}", "pre-{x}-post/{y}"]
)
def test_one_placeholder_per_segment_is_accepted(template):
    assert set(KeyTemplate.parse(template).fields) <= {"x", "y"}


@given(st.text(max_size=40))
def test_every_template_error_is_one_printable_ascii_line(source):
    try:
        KeyTemplate.parse(source)
    except KeyTemplateError as exc:
        message = str(exc)
        assert message.isascii() and message.isprintable(), ascii(message)
        assert len(message) < 1000


@pytest.mark.parametrize(
    "template",
    ["k/{a\nb}", "k/{a\u202eb}", "k\n/{x}", "k/\u202e{x}", "k/{x}\r", "k/{x\x1b[31m}", "k/{x"],
)
def test_template_text_is_escaped_in_the_message(template):
    with pytest.raises(KeyTemplateError) as caught:
        KeyTemplate.parse(template)
    message = str(caught.value)
    assert message.isascii() and message.isprintable(), ascii(message)


def test_a_template_naming_a_missing_parameter_is_one_line(sqlite_url, open_box):
    box = open_box(sqlite_url)
    with pytest.raises(KeyTemplateError, match="uses y, which the handler does not take"):

        @box.task(key="k/{x}/{y}")
        def single(ctx, x: str) -> None:
            pass


def test_an_invalid_key_message_escapes_the_value_and_stays_on_one_line():
    template = KeyTemplate.parse("k/{x}")
    for value in ("a\nb", "a\u202eb", "a/b", "", 1.5):
        with pytest.raises(InvalidKey) as caught:
            template.render({"x": value})
        assert str(caught.value).isascii() and str(caught.value).isprintable()


# -- keys are rendered from the arguments as stored -------------------------------------------


def test_a_str_enum_and_its_value_are_one_operation(sqlite_url, open_box):
    box = open_box(sqlite_url)

    @box.task(key="k/{region}/{shade}")
    def regional(ctx, region: str, shade: int) -> None:
        pass

    first = box.enqueue(regional, region=Region.EU, shade=Shade.DARK)
    assert (first.key, first.created) == ("k/eu/7", True)
    assert not box.enqueue(regional, region="eu", shade=7).created
    many = box.enqueue_many(
        regional, [{"region": Region.EU, "shade": 7}, {"region": "eu", "shade": 8}]
    )
    assert (many.created, many.skipped) == (1, 1)
    assert sorted(job.key for job in box.find("k/eu/8")) == ["k/eu/8"]


def test_a_broker_delivery_renders_the_key_enqueue_would(sqlite_url, open_box):
    """A broker message carries no key: the consumer renders it from the stored arguments,
    which is also what enqueue renders from, so both name one operation."""
    box = open_box(sqlite_url, seed=1234, secret=SECRET)
    ran: list[str] = []

    @box.task(key="k/{region}")
    def regional(ctx, region: str) -> None:
        ran.append(ctx.key)

    broker = RedeliveringTransport(copies=1)
    broker.publish("regional", region=Region.EU)
    consumer = box.consumer(transport=broker)
    try:
        consumer.run_once()
    finally:
        consumer.session.close()
    assert ran == ["k/eu"]
    assert box.enqueue(regional, region=Region.EU).reason == "key_claimed"


def test_the_group_of_a_job_is_its_stored_value(sqlite_url, open_box):
    box = open_box(sqlite_url)

    @box.task(group_by="region")
    def ordered(ctx, region: str) -> None:
        pass

    job_id = box.enqueue(ordered, region=Region.EU).job_id
    assert job_id is not None
    assert box.store.job_get(job_id).group_key == "eu"


def _handler_a(ctx, n: int, label: str = "x", *, flag: bool = False) -> None: ...
def _handler_b(ctx, n, /, m: int | None = None) -> None: ...
def _handler_c(ctx, n: int, **extra: Any) -> None: ...
def _handler_d(ctx, *more: Any, k: float) -> None: ...


@pytest.mark.parametrize("handler", [_handler_a, _handler_b, _handler_c, _handler_d])
@given(args=st.dictionaries(st.sampled_from(["n", "m", "label", "flag", "k", "extra", "more"]),
                            st.sampled_from([1, "1", 1.5, True, None])))  # fmt: skip
def test_the_precomputed_argument_check_agrees_with_python_binding(handler, args):
    """The consumer checks arguments against a shape worked out once per task; it must refuse
    exactly what calling the handler with those arguments would refuse (and then the scalar
    annotations), no more, no less."""
    from oncebox.jobs.tasks import make_task

    task = make_task(handler, name="t", key=None, retry=None, timeout=60, priority=0,
                     queue="default", group_by=None, keep_intents=None)  # fmt: skip
    try:
        task.signature.bind(**args)
        binds = True
    except TypeError:
        binds = False
    if not binds:
        with pytest.raises(InvalidArguments, match="do not fit"):
            task.check_args(args)
        return
    try:
        task.check_args(args)
    except InvalidArguments as exc:
        assert "must be" in str(exc)  # only a scalar annotation may refuse what binds

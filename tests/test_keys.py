from __future__ import annotations

import enum

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncebox.jobs.keys import MAX_KEY_LENGTH, KeyTemplate, _rule_broken, key_problem, validate_key
from oncebox.kernel.errors import (
    InvalidKey,
    KeyTemplateError,
)
from oncebox.testing import RedeliveringTransport

DIGEST = KeyTemplate.parse("weekly-digest/customer-{customer_id}/{period}")


def test_template_renders_the_key_from_the_jobs_own_arguments():
    key = DIGEST.render({"customer_id": 42, "period": "2026-W33", "ignored": "x"})
    assert key == "weekly-digest/customer-42/2026-W33"
    assert DIGEST.fields == ("customer_id", "period")


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("", "non-empty"),
        ("digest/{customer.id}", "plain argument name"),
        ("digest/{0}", "plain argument name"),
        ("digest/{}", "plain argument name"),
        ("digest/{n:05d}", "format spec"),
        ("digest/{n!r}", "conversion"),
        ("digest/{n", "malformed"),
        ("digest//{n}", "empty"),
        ("/digest/{n}", "empty"),
        ("digest/{n}/", "empty"),
        ("digest/../{n}", "not allowed"),
        ("weekly digest/{n}", "contains ' '"),
        ("digest/%s/{n}", "contains '%'"),
    ],
)
def test_a_bad_template_fails_when_declared(template, why):
    with pytest.raises(KeyTemplateError, match=why):
        KeyTemplate.parse(template)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ({"customer_id": 42}, "needs argument 'period'"),
        ({"customer_id": "a/b", "period": "W1"}, "contains '/'"),
        ({"customer_id": "", "period": "W1"}, "empty string"),
        ({"customer_id": True, "period": "W1"}, "bool"),
        ({"customer_id": 1.5, "period": "W1"}, "float"),
        ({"customer_id": None, "period": "W1"}, "NoneType"),
        ({"customer_id": "x'; DROP TABLE t;--", "period": "W1"}, "contains"),
        ({"customer_id": "a\r\nb", "period": "W1"}, "contains"),
        ({"customer_id": "\u0430", "period": "W1"}, "contains"),  # Cyrillic a
        ({"customer_id": "a\u202eb", "period": "W1"}, "contains"),  # RTL override
        ({"customer_id": "x" * 300, "period": "W1"}, "limit is 255"),
    ],
)
def test_a_bad_argument_value_is_refused_with_the_rule_it_broke(args, why):
    with pytest.raises(InvalidKey, match=why):
        DIGEST.render(args)


@pytest.mark.parametrize(
    "key",
    [
        "",
        "a//b",
        "/a",
        "a/",
        "a/./b",
        "a b",
        "a%2Fb",
        "é",
        "a\x00b",
        "a~b",
        "x" * (MAX_KEY_LENGTH + 1),
    ],
)
def test_invalid_keys_are_rejected(key):
    assert key_problem(key) is not None
    with pytest.raises(InvalidKey):
        validate_key(key)


def test_a_key_of_exactly_the_maximum_length_is_valid():
    assert validate_key("k" * MAX_KEY_LENGTH) == "k" * MAX_KEY_LENGTH


@given(
    customer=st.one_of(st.integers(), st.text(max_size=40)),
    period=st.text(max_size=40),
)
def test_rendering_either_yields_a_valid_key_or_refuses(customer, period):
    try:
        key = DIGEST.render({"customer_id": customer, "period": period})
    except InvalidKey:
        return
    assert key_problem(key) is None
    assert key.count("/") == 2  # a value can never add segments


_KEY_TEXT = st.text(alphabet="az09-_.:@+=/~ é\n", max_size=12) | st.text(max_size=12)


@given(key=_KEY_TEXT | st.builds(lambda n: "k" * n, st.integers(250, 260)))
def test_the_one_match_shortcut_agrees_with_the_rule_by_rule_check(key):
    assert key_problem(key) == _rule_broken(key)


SECRET = "test-secret-not-for-production"


class Region(str, enum.Enum):  # noqa: UP042 (a StrEnum's str() is its value: no bug to pin)
    EU = "eu"


class Shade(enum.IntEnum):
    DARK = 7


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


@pytest.mark.parametrize(
    "template",
    [
        "k/{0.__class__}",
        "k/{v.__class__.__mro__}",
        "k/{v[0]}",
        "k/{v:{w}}",
        "k/{v!s}",
        "k/{v!a:>3}",
        "k/{__import__}",  # a plain name, but not a parameter of the handler
        "k/%(v)s",
        "k/${v}",
        "k/{v}\n",
        "k/\u202e{v}",
    ],
)
def test_a_template_that_could_format_more_than_a_value_is_refused_and_not_registered(
    sqlite_url, open_box, template
):
    box = open_box(sqlite_url)
    with pytest.raises(KeyTemplateError):

        @box.task(key=template)
        def keyed(ctx, v: str, w: str = "") -> None:
            pass

    assert box.registry.names() == []


@given(st.text(alphabet=st.sampled_from("{}!:.[]0ax_/- %$\n") | st.characters(), max_size=30))
def test_parsing_any_template_text_either_succeeds_or_raises_key_template_error(source):
    try:
        template = KeyTemplate.parse(source)
    except KeyTemplateError:
        return
    assert all(field.isidentifier() for field in template.fields)
    validate_key(template.render(dict.fromkeys(template.fields, "x")))


@given(st.text(max_size=300))
def test_validate_key_returns_the_key_unchanged_or_refuses_with_a_one_line_ascii_message(text):
    try:
        key = validate_key(text)
    except InvalidKey as exc:
        message = str(exc)
        assert message.isascii() and "\n" not in message and "\r" not in message
        assert len(message) < 1000
        return
    assert key == text and key.isascii() and 1 <= len(key) <= MAX_KEY_LENGTH


_SEGMENT = st.text(alphabet=st.sampled_from("abcXYZ019-_.:@+="), min_size=1, max_size=12).filter(
    lambda s: s not in (".", "..")
)


@given(st.tuples(_SEGMENT, _SEGMENT), st.tuples(_SEGMENT, _SEGMENT))
def test_one_placeholder_per_segment_gives_different_keys_for_different_arguments(a, b):
    template = KeyTemplate.parse("report/customer-{customer}/{period}")
    keys = [template.render({"customer": c, "period": p}) for c, p in (a, b)]
    assert (keys[0] == keys[1]) == (a == b)


@pytest.mark.parametrize(
    ("template", "first", "second"),
    [
        ("k/{x}{y}", {"x": "1", "y": "23"}, {"x": "12", "y": "3"}),
        ("k/{x}-{y}", {"x": "a-b", "y": "c"}, {"x": "a", "y": "b-c"}),
    ],
)
def test_different_arguments_never_share_a_key(sqlite_url, open_box, template, first, second):
    box = open_box(sqlite_url)
    try:

        @box.task(key=template)
        def pair(ctx, x: str, y: str) -> None:
            pass

    except KeyTemplateError:
        return  # refusing the ambiguous template is a correct fix too
    assert box.enqueue_args(pair, first).created
    assert box.enqueue_args(pair, second).created

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oncebox.errors import InvalidKey, KeyTemplateError
from oncebox.jobs.keys import MAX_KEY_LENGTH, KeyTemplate, _rule_broken, key_problem, validate_key

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

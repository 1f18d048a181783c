"""An email payload is refused when a handler writes it if it could never be rendered, so no key
is claimed for a message that is dead for ever: whatever `email_payload` accepts renders."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncebox.kernel.errors import InvalidArguments
from oncebox.providers import Outgoing
from oncebox.providers.email import render
from oncebox.providers.email_payload import LINE_BREAKS, email_payload

DATE = datetime(2026, 8, 17, 9, tzinfo=UTC)


def payload(subject: str = "s", headers: dict[str, str] | None = None) -> dict[str, object]:
    return email_payload(
        to="c@y.example",
        subject=subject,
        text="t",
        html=None,
        headers=headers,
        sender="d@x.example",
        reply_to=None,
        date=DATE,
    )


def rendered(body: dict[str, object]) -> bytes:
    return bytes(render(Outgoing(1, "email", "tok", body, 1)))


@pytest.mark.parametrize("char", sorted(LINE_BREAKS), ids=lambda c: f"U+{ord(c):04X}")
def test_a_line_break_of_any_kind_in_a_subject_or_header_is_refused_when_written(char):
    with pytest.raises(InvalidArguments, match=f"U\\+{ord(char):04X}"):
        payload(subject=f"Your shipments{char}Bcc: x@evil.example")
    with pytest.raises(InvalidArguments, match="must be one line of text"):
        payload(headers={"X-Note": f"a{char}b"})


@settings(max_examples=300, deadline=None)
@given(subject=st.text(max_size=40), note=st.text(max_size=40))
def test_whatever_is_accepted_when_written_renders(subject, note):
    try:
        body = payload(subject=subject, headers={"X-Note": note})
    except InvalidArguments:
        return
    assert rendered(body)

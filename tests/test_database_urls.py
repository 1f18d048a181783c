"""Database URLs: a password is never shown (`redact`), libpq's part is passed on as written
(`split_url`), and a malformed URL is refused as a one-line ConfigurationError without the
password.
"""

from __future__ import annotations

import pytest

from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.inert import redact
from oncebox.store import open_store
from oncebox.store.postgres import PostgresStore, split_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://bob:s3cret@h:5432/db", "postgresql://bob:***@h:5432/db"),
        ("postgresql://bob:s3cr%40t@h/db", "postgresql://bob:***@h/db"),
        ("postgresql://bob:s3c@ret@h/db", "postgresql://bob:***@h/db"),  # an unencoded @
        ("postgresql://bob:s3cret@[::1/db", "postgresql://bob:***@[::1/db"),  # not a valid URL
        ("postgresql://h/db?password=s3cret", "postgresql://h/db?password=***"),
        (
            "postgresql://h/db?sslmode=require&PASSWORD=s3cret&connect_timeout=2",
            "postgresql://h/db?sslmode=require&PASSWORD=***&connect_timeout=2",
        ),
        ("postgresql://h/db?sslpassword=s3cret", "postgresql://h/db?sslpassword=***"),
        (
            "postgresql://bob:s3cret@h/db?password=s3cret2",
            "postgresql://bob:***@h/db?password=***",
        ),
        ("host=h password=s3cret dbname=x", "host=h password=*** dbname=x"),
        ("host=h password = 's3 cret' dbname=x", "host=h password = *** dbname=x"),
        (
            "postgresql://bob@h:5432/db?connect_timeout=2",
            "postgresql://bob@h:5432/db?connect_timeout=2",
        ),
        ("postgresql:///db?host=/run/postgresql", "postgresql:///db?host=/run/postgresql"),
        ("sqlite:///path/x.db", "sqlite:///path/x.db"),
        ("postgresql://bob:s3cret@h/db\n\x1b[31m", "postgresql://bob:***@h/db\\n\\x1b[31m"),
    ],
)
def test_redact_hides_every_password_and_leaves_the_rest_as_written(url, shown):
    assert redact(url) == shown
    assert "s3c" not in redact(url)


@pytest.mark.parametrize(
    ("url", "conninfo", "ours"),
    [
        ("postgresql:///mydb", "postgresql:///mydb", {}),
        (
            "postgres:///db?host=127.0.0.1&port=1&schema=s&pool_max=3",
            "postgresql:///db?host=127.0.0.1&port=1",
            {"schema": "s", "pool_max": "3"},
        ),
        (
            "postgresql://u@h/db?options=-c%20search_path%3Dx&connect_timeout=2",
            "postgresql://u@h/db?options=-c%20search_path%3Dx",
            {"connect_timeout": "2"},
        ),
        ("postgresql://h1:1,h2:2/db", "postgresql://h1:1,h2:2/db", {}),
        ("postgresql://[::1]:5432/db", "postgresql://[::1]:5432/db", {}),
    ],
    ids=["socket", "hostless-with-options", "encoded-option-kept", "multi-host", "ipv6"],
)
def test_split_url_keeps_what_libpq_receives_as_written(url, conninfo, ours):
    assert split_url(url) == (conninfo, ours)


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("postgresql://bob:s3cret@[::1/db", 'matching "]"'),
        ("postgresql://bob:s3cret@127.0.0.1:notaport/db", "port 'notaport'"),
        ("postgresql://bob:s3cret@127.0.0.1:99999/db", "port '99999'"),
        ("postgresql://bob:s3cret@127.0.0.1:" + "9" * 5000 + "/db", "is not a number"),
        ("postgresql://bob:s3cret@h/db?port=5432,x", "port 'x'"),
        ("postgresql://bob:s3cret@h/db?bogus=1", 'invalid URI query parameter: "bogus"'),
        ("postgresql://bob:s3cr%zzt@h/db", "invalid percent-encoded token"),
        ("postgresql://bob:s3cret@h/db\x00", "contains a NUL"),
        ("postgresql://bob:s3cret@h/db?bogus\x1b=1", "bogus\\x1b"),
    ],
)
def test_a_malformed_postgresql_url_is_a_configuration_error_without_the_password(url, needle):
    with pytest.raises(ConfigurationError, match="malformed") as caught:
        open_store(url)
    message = str(caught.value)
    assert needle in message and "s3c" not in message, message
    assert len(message) < 300 and "\n" not in message


@pytest.mark.parametrize(
    "query", ["connect_timeout=nan", "connect_timeout=-1", "pool_min=-1", "pool_max=0"]
)
def test_pool_options_out_of_range_are_configuration_errors(query):
    with pytest.raises(ConfigurationError, match="must be numbers"):
        PostgresStore(f"postgresql://bob:s3cret@127.0.0.1:1/db?{query}")


@pytest.mark.parametrize(
    "url",
    [
        "host=127.0.0.1 password=s3cret dbname=db",
        "password=s3cret host=h://x",  # a '://' after text that is no scheme
        "s3cret",
        "",
    ],
)
def test_text_that_is_not_a_url_is_refused_without_being_echoed(url):
    with pytest.raises(ConfigurationError, match="is not a URL") as caught:
        open_store(url)
    assert "s3cret" not in str(caught.value)


def test_a_sqlite_url_with_a_host_part_is_refused_without_being_echoed():
    for url in ("sqlite://bob:s3cret@host/x.db", "sqlite://bob:s3cret@[x/db"):
        with pytest.raises(ConfigurationError, match="has a host part") as caught:
            open_store(url)
        assert "s3cret" not in str(caught.value)

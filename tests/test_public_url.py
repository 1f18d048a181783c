"""A served app's public URL: what `--public-url` accepts, the hosts and origins that follow from
it and from the bind address, and the command line's mistakes and warning about it."""

from __future__ import annotations

import pytest

from oncebox.cli.console_cmd import checked_web_options
from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.public_url import PublicUrl, for_server, host_of, parse
from test_cli import assert_one_line_error, oncebox


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("https://OPS.example", ("https", "ops.example", 443, "")),
        ("https://ops.example:443/oncebox/", ("https", "ops.example", 443, "/oncebox")),
        ("http://10.0.0.5:8080/", ("http", "10.0.0.5", 8080, "")),
        ("http://[::1]:8080/ops", ("http", "::1", 8080, "/ops")),
    ],
)
def test_a_public_url_is_a_scheme_a_host_a_port_and_a_path(url, parsed):
    assert parse(url) == parsed


@pytest.mark.parametrize(
    "url",
    [
        "ftp://ops.example",
        "ops.example",
        "https://",
        "https://olga:pw@ops.example",
        "https://ops.example/?next=1",
        "https://ops.example/#top",
        "https://ops.example:99999",
        "http://[::1",
        "https://ops.example/\x1b[2J",
    ],
)
def test_anything_else_is_refused_in_one_line(url):
    with pytest.raises(ConfigurationError, match=r"expected http\(s\)://HOST") as refused:
        parse(url)
    assert "\n" not in str(refused.value) and "\x1b" not in str(refused.value)


@pytest.mark.parametrize(
    ("header", "host"),
    [
        ("Ops.Example", "ops.example"),
        ("ops.example:8443", "ops.example"),
        ("[::1]:8080", "::1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
    ],
)
def test_the_host_of_a_host_header(header, host):
    assert host_of(header) == host


def test_the_public_url_given_is_what_links_show_and_the_bind_address_stays_its_own():
    public = for_server("https://ops.example/oncebox", "127.0.0.1", 8080, "")
    assert (public.base, public.origin, public.path, public.secure) == (
        "https://ops.example/oncebox",
        "https://ops.example",
        "/oncebox",
        True,
    )
    assert public.hosts == {"ops.example", "127.0.0.1", "localhost", "::1"}
    assert public.accepts_origin("https://ops.example")
    assert public.accepts_origin("http://localhost:8080")  # straight at the bind address
    assert not public.accepts_origin("http://ops.example")  # not the scheme it is served on
    assert not public.accepts_origin("https://ops.example:8443")
    assert not public.accepts_origin("https://evil.example")


def test_without_a_public_url_the_bind_address_is_it():
    loopback = for_server(None, "127.0.0.1", 8080, "/ops")
    assert (loopback.base, loopback.given, loopback.secure) == (
        "http://127.0.0.1:8080/ops",
        False,
        False,
    )
    assert loopback.accepts_host("localhost:8080") and loopback.accepts_host("[::1]:8080")
    private = for_server(None, "10.0.0.5", 8080, "")
    assert private.hosts == {"10.0.0.5"}
    assert private.accepts_origin("http://10.0.0.5:8080")
    assert not private.accepts_host("ops.example") and not private.accepts_host(None)


@pytest.mark.parametrize("bind", ["0.0.0.0", "::"])  # noqa: S104
def test_on_every_address_only_the_loopback_names_are_its_own_unless_a_url_is_given(bind):
    assert for_server(None, bind, 8080, "").hosts == {"localhost", "127.0.0.1", "::1"}
    given = for_server("https://ops.example", bind, 8080, "")
    assert given.hosts == {"ops.example", "localhost", "127.0.0.1", "::1"}


def test_an_app_mounted_elsewhere_has_its_public_urls_host_and_origin_alone():
    public = PublicUrl.of("https://ops.example/oncebox")
    assert public.hosts == {"ops.example"} and public.origins == {"https://ops.example"}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--public-url", "ops.example"], "--public-url: public URL 'ops.example': expected"),
        (
            ["--public-url", "https://ops.example/a", "--root-path", "/b"],
            "its path is '/a', the root path '/b': give the same prefix",
        ),
        (
            ["--public-url", "https://ops.example/a", "--public-url", "http://10.0.0.5/b"],
            "--public-url 'http://10.0.0.5/b': its path is '/b', the root path '/a'",
        ),
    ],
)
@pytest.mark.parametrize("command", ["console", "serve"])
def test_a_bad_public_url_is_a_usage_mistake(tmp_path, command, args, said):
    app = ["--app", "support.cli_freight"] if command == "serve" else []
    db = f"sqlite:///{tmp_path / 'x.db'}"
    assert_one_line_error(oncebox(command, "--db", db, *app, *args), 2, said)


def test_listening_on_every_address_without_a_public_url_is_said(capsys):
    served = checked_web_options("0.0.0.0:8080", "", ())
    said = capsys.readouterr().err
    assert "without --public-url" in said and "localhost, 127.0.0.1 or ::1" in said
    assert served.public.hosts == {"localhost", "127.0.0.1", "::1"}
    checked_web_options("0.0.0.0:8080", "", ["https://ops.example"])
    checked_web_options("127.0.0.1:8080", "", ())
    assert capsys.readouterr().err == ""


def test_the_public_urls_path_is_the_root_path_when_none_is_given_and_the_reverse():
    served = checked_web_options("127.0.0.1:8080", "", ["https://ops.example/oncebox/"])
    assert (served.root_path, served.base) == ("/oncebox", "https://ops.example/oncebox")
    served = checked_web_options("127.0.0.1:8080", "/ops", ["https://ops.example"])
    assert (served.root_path, served.base) == ("/ops", "https://ops.example/ops")


def test_a_second_public_url_is_a_name_of_its_own_that_links_do_not_show():
    urls = ["https://ops.example/ops", "http://oncebox.internal:8080"]
    served = checked_web_options("0.0.0.0:8080", "", urls)
    assert served.base == "https://ops.example/ops"
    assert served.public.accepts_host("oncebox.internal:8080")
    assert served.public.accepts_origin("http://oncebox.internal:8080")
    assert not served.public.accepts_host("evil.example")

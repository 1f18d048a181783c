"""`oncebox metrics --bind HOST:PORT`: the store-wide figures for Prometheus to scrape.

One exporter per database: every figure is read from the store on each scrape (the schedules'
period figures from a background refresh: `status.PeriodFigures`), so one copy is the
whole truth, and two would only be counted twice by `sum()`.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import click
from prometheus_client.registry import Collector

from oncebox.cli.common import app_option, box_for_admin, db_option, reported, say
from oncebox.kernel.errors import ConfigurationError


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr: a scrape every 15 s is not news."""

    def log_message(self, format: str, *args: object) -> None:
        return


def parse_bind(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:9464` for IPv6); port 0 picks a free one, printed at start."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ConfigurationError(f"--bind {text!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
    return host, int(port)


def serve(bind: str, collector: Collector) -> WSGIServer:
    """A server for `collector` at /metrics on `bind` (not serving yet: `serve_forever`)."""
    from prometheus_client import make_wsgi_app  # noqa: PLC0415 (only the exporters need it)
    from prometheus_client.registry import CollectorRegistry  # noqa: PLC0415

    host, port = parse_bind(bind)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        return make_server(host, port, make_wsgi_app(registry), handler_class=_QuietHandler)
    except OSError as exc:
        raise ConfigurationError(f"cannot listen on {bind}: {exc.strerror or exc}") from None


def address(server: WSGIServer) -> str:
    host = str(server.server_address[0])
    return f"http://{f'[{host}]' if ':' in host else host}:{server.server_port}/metrics"


@click.command()
@click.option(
    "--bind",
    "bind",
    default="127.0.0.1:9464",
    show_default=True,
    metavar="HOST:PORT",
    help="Where to serve /metrics (port 0: a free port, printed at start).",
)
@app_option
@db_option
def metrics(bind: str, app: str | None, db: str | None) -> None:
    """Serve the store's figures — the counters, depths, ages and periods of `oncebox status`
    — at /metrics in Prometheus's text format, read from the store on every scrape (the period
    figures refreshed in the background, at least every 30 s). Run one per database. SIGTERM or
    Ctrl-C stops it."""
    from oncebox.cli.prometheus import StoreCollector  # noqa: PLC0415
    from oncebox.status import PeriodFigures  # noqa: PLC0415

    with reported():
        box = box_for_admin(app, db)
        figures = PeriodFigures(box)
        figures.refresh()  # a store that cannot be read is said now, not at the first scrape
        server = serve(bind, StoreCollector(box, figures))
    stop = threading.Event()

    def handle(_signum: int, _frame: FrameType | None) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    # Before the line that says it serves: whoever reads that line may stop it at once, and a
    # SIGTERM before the handler ends the process by the signal (-15), not cleanly.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handle)
    say(f"serving {address(server)} for {box.where}")
    threading.Thread(target=figures.run, args=(stop,), name="oncebox-periods", daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        box.close()

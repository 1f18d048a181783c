"""What a broker's own deduplication is worth: each job published twice, and who removed the copy.

    .venv/bin/python bench/dedupe.py [--jobs 200] [--gaps 1,60,600] [--postgres URL]
                                     [--amqp URL] [--nats URL] [--poll 1]
                                     [--json bench/results/dedupe.json]

A relay whose answer is lost publishes a job's attempt again; a producer retries; an operator
redrives yesterday's dead letters. Each broker-held queue here gets N jobs, enqueued `relayed` on
PostgreSQL and published by the relay, and drained by one lane (each runs once). Then, after a
gap, each job's publish is sent again — the same body and the same id (the relay's token, which
is SQS FIFO's deduplication id and JetStream's `Nats-Msg-Id`) — and the lane drains again. Per
broker and gap, the second copies split into:

- **removed by the broker** before any consumer saw them (SQS FIFO's five-minute deduplication,
  JetStream's duplicate window — two minutes by default);
- **absorbed by the key**: delivered, read against the job's row, acknowledged unrun and counted
  (`deliveries_stale`, or `claim_conflicts` for a done job's copy).

The job's handler ran once either way; the run fails if any ran twice. The `redrive` row sends
each copy first to the queue's dead letters and then back from there, as a broker's redrive tool
does (same body and id), once the longest gap has passed — the soonest a redrive "the next
morning" could come.

SQS is moto's server (`oncebox.fakes.sqs`: FIFO deduplication remembers an id for five minutes
as AWS documents, whether or not the first copy was deleted); RabbitMQ and NATS are the machine's
servers. Gaps are real time: the default run takes about eleven minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import postgres_url

import oncebox
from oncebox import Box, ConsumerConfig
from oncebox.brokers.brokered import RELAY_PREFIX, wire_for
from oncebox.brokers.messages import Message
from oncebox.brokers.transport import BrokerTransport
from oncebox.lanes.dispatcher import DispatcherConfig, OutboxDispatcher
from oncebox.store.params import JobFilter

ABSORBED = ("deliveries_stale", "claim_conflicts")
DRAIN_FIRST_S = 30.0  # a gap this long: its first copies run before the second is sent


@dataclass
class Lane:
    """One broker's queue for one gap: its jobs, a consumer lane, a raw wire to publish copies."""

    broker: str  # the row's name
    url: str
    gap: str  # "1", "60", … or "redrive"
    queue: str
    task: str
    transport: BrokerTransport
    wire: Any
    due_after: float  # seconds from the first copies to the second
    copies: list[Message] = field(default_factory=list)
    first_at: float = 0.0
    again_at: float = 0.0
    ran: int = 0
    absorbed: int = 0


def drain(box: Box, lane: Lane) -> tuple[int, int]:
    """Consumer rounds until one leases nothing and no stale copy was acknowledged in it (a
    round whose batch is all stale leases nothing, yet more may follow); (ran, absorbed)."""
    consumer = box.consumer(ConsumerConfig(batch_size=100), transport=lane.transport)
    ran = absorbed = 0
    try:
        while True:
            before = sum(box.store.counter_list().get(name, 0) for name in ABSORBED)
            leased = consumer.run_once().leased
            after = sum(box.store.counter_list().get(name, 0) for name in ABSORBED)
            ran += leased
            absorbed += after - before
            if not leased and after == before:
                return ran, absorbed
    finally:
        consumer.session.close()


def brokers(amqp: str | None, nats: str | None, sqs_endpoint: str, poll: float) -> dict[str, str]:
    """The brokers measured, by row name: their URLs."""
    sqs = {"endpoint": sqs_endpoint, "visibility": 30, "wait": round(poll)}
    found = {
        "sqs-standard": f"sqs://us-east-1?{urlencode(sqs)}",
        "sqs-fifo": f"sqs://us-east-1?{urlencode({**sqs, 'fifo': 'true'})}",
    }
    if amqp:
        found["rabbitmq"] = amqp
    if nats:
        found["nats"] = nats
    return dict(sorted(found.items()))


def lanes_for(box: Box, urls: dict[str, str], gaps: list[float], poll: float) -> list[Lane]:
    """A lane per broker and gap, and per broker a `redrive` lane due after the longest gap."""
    lanes = []
    named = [(_name(g), g) for g in gaps] + [("redrive", max(gaps))]
    for broker, url in urls.items():
        for gap, due_after in named:
            queue = f"dedupe-{broker}-{gap}-{uuid.uuid4().hex[:6]}"
            task = f"noop_{broker}_{gap}".replace("-", "_")

            def noop(ctx: oncebox.JobContext, n: int) -> None:
                pass

            box.task(key=f"dedupe/{broker}/{gap}/{{n}}", queue=queue, name=task)(noop)
            box.queue(queue, broker=url)
            wire = wire_for(url, queue)
            wire.declare()
            transport = BrokerTransport(
                wire_for(url, queue, prefetch=100, wait_s=poll),
                attempts=lambda name: box.registry.get(name).retry.max_attempts,
                now=box.store.clock_now,
                store=box.store,
                worker="bench",
            )
            transport.queue.declare()
            lanes.append(Lane(broker, url, gap, queue, task, transport, wire, due_after))
    return lanes


def first_copies(box: Box, lanes: list[Lane], jobs: int) -> None:
    """Each lane's jobs enqueued and published by the relay (a dispatcher on its channel only),
    the longest gaps first, so that the shortest are due after the last publish; each publish
    remembered, to be sent again. A short gap's copies go as soon as they are due — between
    the next lanes' relays, and after the last."""
    short = [lane for lane in lanes if lane.due_after < DRAIN_FIRST_S]
    for lane in sorted(lanes, key=lambda lane: -lane.due_after):
        box.enqueue_many(lane.task, [{"n": n} for n in range(jobs)])
        channel = f"{RELAY_PREFIX}{lane.queue}"
        relay = OutboxDispatcher(
            box.store,
            {channel: box.channels[channel]},
            DispatcherConfig(),
            box.metrics,
            worker="bench-relay",
        )
        while relay.run_once().sent:
            pass
        lane.first_at = time.monotonic()
        for job in box.store.job_list(JobFilter(queue=lane.queue, limit=jobs)):
            [publish] = box.store.outbox_find_by_key(f"~relay/{job.id}/1")
            lane.copies.append(Message(publish.payload_json.encode(), publish.token))
        for due in short:
            if due.first_at and not due.again_at and due_in(due) <= 0:
                send_again(due)
    for due in sorted(short, key=due_in):
        send_again(due)


def due_in(lane: Lane) -> float:
    return lane.first_at + lane.due_after - time.monotonic()


def send_again(lane: Lane) -> None:
    """The lane's publishes again, once its gap has passed since its first."""
    if lane.again_at:
        return
    wait = due_in(lane)
    if wait > 0:
        if wait >= 1:
            print(f"  waiting {wait:.0f} s for the {lane.gap} copies", file=sys.stderr)
        time.sleep(wait)
    lane.again_at = time.monotonic()
    if lane.gap == "redrive":
        redriven(lane)
    else:
        lane.wire.publish(lane.copies)


def redriven(lane: Lane) -> None:
    """Each copy to the dead letters, then back: what a broker's redrive tool sends."""
    kind = lane.url.split(":", 1)[0]
    dead = {"sqs": "dead_name", "nats": "dead_subject"}.get(kind)
    dead = getattr(lane.wire, dead) if dead else f"{lane.wire.name}.dead"  # RabbitMQ's
    lane.wire.publish(lane.copies, to=dead)
    lane.wire.publish(lane.copies)


def count(box: Box, lane: Lane) -> None:
    ran, absorbed = drain(box, lane)
    lane.ran += ran
    lane.absorbed += absorbed


def second_copies(box: Box, lanes: list[Lane]) -> None:
    """The long gaps' publishes again, after their first copies ran (drained while the gaps
    run); then every lane drained. The short gaps' were sent before any consumer ran (a relay
    resending at once races its first copy)."""
    later = [lane for lane in lanes if lane.due_after >= DRAIN_FIRST_S]
    for lane in later:
        count(box, lane)
    for lane in sorted(later, key=lambda lane: lane.first_at + lane.due_after):
        send_again(lane)
    for lane in lanes:
        count(box, lane)


def _name(gap: float) -> str:
    return f"{gap:g}"


def report(lanes: list[Lane], jobs: int) -> list[dict[str, Any]]:
    rows = []
    for lane in lanes:
        if lane.ran != jobs:
            raise SystemExit(f"{lane.queue}: {lane.ran} runs of {jobs} jobs (each once)")
        in_flight = getattr(lane.wire, "in_flight", lambda: 0)
        if lane.wire.depth() or in_flight():  # "removed" must not count what was not delivered
            raise SystemExit(f"{lane.queue}: copies still waiting in the broker after the drain")
        removed = jobs - lane.absorbed
        rows.append(
            {
                "broker": lane.broker,
                "gap": lane.gap,
                "gap_s": round(lane.again_at - lane.first_at, 1),
                "copies": jobs,
                "removed_by_broker": removed,
                "absorbed_by_key": lane.absorbed,
                "removed_share": round(removed / jobs, 3),
                "absorbed_share": round(lane.absorbed / jobs, 3),
            }
        )
    return rows


@contextmanager
def measured(
    server: str, urls: Callable[[str], dict[str, str]]
) -> Iterator[tuple[Box, dict[str, str]]]:
    """A fresh PostgreSQL database, a box on it, and SQS on moto's server, for the run."""
    from oncebox.fakes.sqs import sqs_server

    with ExitStack() as stack:
        endpoint = stack.enter_context(sqs_server())
        url = stack.enter_context(postgres_url(server)())
        box = Box(url)
        stack.callback(box.close)
        yield box, urls(endpoint)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--gaps", default="1,60,600", help="seconds between the copies")
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/postgres")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--nats", default="nats://127.0.0.1:4222")
    parser.add_argument(
        "--poll", type=float, default=1.0, help="a lane's long poll, s (SQS: whole seconds)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    gaps = sorted(float(g) for g in args.gaps.split(","))
    started_run = time.monotonic()

    def urls_for(endpoint: str) -> dict[str, str]:
        return brokers(args.amqp or None, args.nats or None, endpoint, args.poll)

    with measured(args.postgres, urls_for) as (box, urls):
        lanes = lanes_for(box, urls, gaps, args.poll)
        try:
            first_copies(box, lanes, args.jobs)
            second_copies(box, lanes)
            rows = report(lanes, args.jobs)
        finally:
            for lane in lanes:
                lane.transport.close()
                lane.wire.delete()
                lane.wire.close()
    print(f"{'broker':14} {'copy sent':>22} {'removed by broker':>18} {'absorbed by key':>16}")
    for row in rows:
        sent = f"{row['gap_s']:g} s later" + (" (redrive)" if row["gap"] == "redrive" else "")
        print(
            f"{row['broker']:14} {sent:>22} {row['removed_share']:>17.0%} "
            f"{row['absorbed_share']:>15.0%}"
        )
    if args.json:
        figures = {
            "jobs": args.jobs,
            "gaps_s": gaps,
            "seconds": round(time.monotonic() - started_run),
            "rows": rows,
        }
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The broker transports beside the built-in table queue: keyed no-op jobs/s, end to end with the
claim, one consumer lane each, in the same run.

    .venv/bin/python bench/brokers.py [--jobs 20000] [--rounds 3] [--postgres URL]
                                      [--amqp URL] [--nats URL]
                                      [--json bench/results/brokers.json]

On a fresh PostgreSQL database per system and round: the table queue gets N keyed jobs with
`enqueue_many` and one lane drains them (`box.consumer()`, default settings). RabbitMQ twice:
unrecorded — the same N published to a quorum queue of its own (`publish_unrecorded`'s message,
confirmed, in batches), then one lane drains them through `RabbitTransport`; and recorded — the
same N enqueued `relayed` on a queue `box.queue(..., broker=...)` declares (each with its
publish row), published by the relay (one dispatcher, batches in one AMQP transaction), then
drained by one lane that checks and settles each job's row; NATS JetStream recorded the same way
(`--nats ''` leaves it out). SQS is not measured: the local server is moto's, whose speed says
nothing of AWS's. The same claim in the same consumer
transaction throughout, the acknowledgement after it. Statistics are analysed after the load,
as autovacuum would. Processing only is timed (for the recorded path: the relay, then the lane;
its rate is over both); the figure is the median of the rounds, the ratio is taken within a
round.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from core import analyse, postgres_url

import oncebox
from oncebox import Box, ConsumerConfig
from oncebox.brokers.brokered import wire_for
from oncebox.brokers.rabbitmq.transport import RabbitTransport, task_message
from oncebox.brokers.rabbitmq.wire import RabbitQueue
from oncebox.brokers.transport import BrokerTransport

PUBLISH_BATCH = 1_000


def declare(box: Box, queue: str) -> None:
    @box.task(key="bench/{n}", queue=queue)
    def noop(ctx: oncebox.JobContext, n: int) -> None:
        pass


def drain(box: Box, consumer_transport: BrokerTransport | None, jobs: int) -> float:
    consumer = box.consumer(ConsumerConfig(), transport=consumer_transport)
    done = 0
    started = time.perf_counter()
    try:
        while done < jobs:
            result = consumer.run_once()
            if not result.leased and consumer_transport is None:
                raise SystemExit(f"the table queue ran dry after {done} of {jobs}")
            done += result.completed
    finally:
        consumer.session.close()
    return jobs / (time.perf_counter() - started)


def table(server: str, jobs: int, *, relay_trigger: bool = True) -> float:
    """The table queue; without `relay_trigger`, with 0016's relay triggers disabled — what
    they cost a table queue's statements (each tests its transition tables and returns)."""
    with postgres_url(server)() as url:
        box = Box(url)
        try:
            declare(box, "default")
            if not relay_trigger:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(
                        "ALTER TABLE oncebox_jobs DISABLE TRIGGER oncebox_jobs_relay_insert, "
                        "DISABLE TRIGGER oncebox_jobs_relay_update"
                    )
            box.enqueue_many("noop", [{"n": n} for n in range(jobs)])
            analyse(url)
            return drain(box, None, jobs)
        finally:
            box.close()


def rabbitmq(server: str, amqp: str, jobs: int) -> float:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    with postgres_url(server)() as url:
        box = Box(url)
        wire = RabbitQueue(amqp, name, prefetch=ConsumerConfig().batch_size * 4, wait_s=2.0)
        try:
            declare(box, name)
            wire.declare()
            task = box.registry.get("noop")
            for offset in range(0, jobs, PUBLISH_BATCH):
                wire.publish(
                    [
                        task_message(task, {"n": n}, box.runtime.max_payload_bytes)
                        for n in range(offset, min(jobs, offset + PUBLISH_BATCH))
                    ]
                )
            analyse(url)
            transport = RabbitTransport(
                wire,
                attempts=lambda _task: 3,
                now=box.store.clock_now,
            )
            return drain(box, transport, jobs)
        finally:
            wire.delete()
            wire.close()
            box.close()


def relayed(server: str, broker: str, jobs: int, prefix: str = "") -> dict[str, float]:
    """A broker (RabbitMQ, NATS JetStream) with the jobs recorded: enqueued `relayed` (as
    `enqueue_many` does), published by the relay (the outbox dispatcher, one lane), drained by
    one lane. Timed: the relay, then the lane; the end-to-end rate is over both."""
    name = f"bench-{uuid.uuid4().hex[:8]}"
    with postgres_url(server)() as url:
        box = Box(url)
        wire = wire_for(broker, name)
        try:
            declare(box, name)
            box.queue(name, broker=broker)
            wire.declare()
            started = time.perf_counter()
            box.enqueue_many("noop", [{"n": n} for n in range(jobs)])
            enqueue_rate = jobs / (time.perf_counter() - started)
            analyse(url)
            dispatcher = box.dispatcher()
            started = time.perf_counter()
            published = 0
            while published < jobs:
                sent = dispatcher.run_once().sent
                if not sent:
                    raise SystemExit(f"the relay ran dry after {published} of {jobs}")
                published += sent
            relay_s = time.perf_counter() - started
            transport = BrokerTransport(
                wire_for(broker, name, prefetch=ConsumerConfig().batch_size * 4, wait_s=2.0),
                attempts=lambda _task: 3,
                now=box.store.clock_now,
                store=box.store,
                worker="bench",
            )
            consume_rate = drain(box, transport, jobs)
            transport.close()
            total_s = relay_s + jobs / consume_rate
            return {
                f"{prefix}relayed_enqueue": enqueue_rate,
                f"{prefix}relay": jobs / relay_s,
                f"{prefix}relayed_consume": consume_rate,
                f"{prefix}relayed": jobs / total_s,
            }
        finally:
            wire.delete()
            wire.close()
            box.close()


def reachable(broker: str) -> bool:
    """Whether a broker answers at `broker` (compare.py measures RabbitMQ only then)."""
    parts = urlsplit(broker)
    port = parts.port or (4222 if parts.scheme == "nats" else 5672)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", port), 5).close()
    except OSError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", default="postgresql://127.0.0.1:5432/test")
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="'' to leave out")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rounds: list[dict[str, float]] = []
    for _ in range(args.rounds):
        row = {"table": table(args.postgres, args.jobs)}
        row["table_without_relay_trigger"] = table(args.postgres, args.jobs, relay_trigger=False)
        row["relay_trigger_ratio"] = row["table"] / row["table_without_relay_trigger"]
        row["rabbitmq"] = rabbitmq(args.postgres, args.amqp, args.jobs)
        row["ratio"] = row["rabbitmq"] / row["table"]
        row.update(relayed(args.postgres, args.amqp, args.jobs))
        row["relayed_ratio"] = row["relayed"] / row["table"]
        if args.nats:
            row.update(relayed(args.postgres, args.nats, args.jobs, prefix="nats_"))
            row["nats_relayed_ratio"] = row["nats_relayed"] / row["table"]
        rounds.append(row)
    figures: dict[str, Any] = {
        "jobs": args.jobs,
        "rounds": args.rounds,
        **{k: round(statistics.median(r[k] for r in rounds), 4) for k in rounds[0]},
    }
    print(
        f"keyed no-op jobs/s, one lane: table queue {figures['table']:.0f}, "
        f"RabbitMQ unrecorded {figures['rabbitmq']:.0f} ({figures['ratio']:.2f}x), "
        f"RabbitMQ recorded {figures['relayed']:.0f} ({figures['relayed_ratio']:.2f}x: the "
        f"relay {figures['relay']:.0f}/s, the lane {figures['relayed_consume']:.0f}/s); "
        f"the table queue with 0016's relay triggers disabled "
        f"{figures['table_without_relay_trigger']:.0f} ({figures['relay_trigger_ratio']:.2f}x "
        "with them)"
        + (
            f"; NATS JetStream recorded {figures['nats_relayed']:.0f} "
            f"({figures['nats_relayed_ratio']:.2f}x: the relay {figures['nats_relay']:.0f}/s, "
            f"the lane {figures['nats_relayed_consume']:.0f}/s)"
            if args.nats
            else ""
        )
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

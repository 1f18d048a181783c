"""The notices: a keyed task whose handler writes its effect and a message to each channel, its
enqueuers, the two channels' providers, and what must hold of them.

- `notice(customer, period)`, keyed `notice/{customer}/{period}`: its handler writes its effect
  through the claim's connection (`sim_effects`) and one message to each channel, then, by the
  run's choice, returns, asks to be retried later, fails, or fails for good;
- `mail`: an idempotent provider (a one-hour window); `hook`: a provider that keeps no keys, its
  unknown outcomes held for a person (`ambiguity="hold"`);
- one key's messages the database refuses (`REFUSED`, a trigger on the outbox, as a business
  constraint would): its handler always returns, its transaction is always refused, and it must
  end dead after its attempts, costing the jobs that shared its batches nothing;
- actors: `enqueue` (one job) and `enqueue-many` (up to three at once).

Its invariants (docs/simulation.md): S3 and F2 on the effects, D1, D2 and D3 on the providers'
copies and the messages' tokens, and, once faults stop, A1 on the handler's runs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import timedelta

from oncebox.brokers.brokered import RELAY_PREFIX
from oncebox.jobs.retry import Retry
from oncebox.kernel.errors import Permanent, RetryLater
from oncebox.outbox.tokens import derive_token, idempotency_key
from oncebox.queue.context import JobContext
from oncebox.sim.invariants import Violation
from oncebox.sim.parts import Part, Rows, Stage, Starter
from oncebox.sim.providers import SimProvider

CUSTOMERS = 4
PERIODS = ("2026-W01", "2026-W02")
WINDOW = timedelta(hours=1)
NOTICE_KEY = "notice/{customer}/{period}"
REFUSED = "notice/3/2026-W02"  # the key whose messages the database refuses (`_refusal`)
RESENT_BY_A_PERSON = ("resolve-resend", "replay")
LANES = ("resolver", "provider")  # the audit's actors that are lanes, not people


class Notices(Part):
    """See the module docstring."""

    name = "notices"

    def __init__(self, world: Stage) -> None:
        self.world = world
        self.runs: Counter[tuple[int, int]] = Counter()  # handler runs, by (job, attempt)
        self.quieted = False
        self._business_table()
        self._refusal()
        box, choices, real = world.box, world.choices, world.real
        self.mail = SimProvider("mail", world.scheduler, choices, world.clock_now, WINDOW)
        self.hook = SimProvider("hook", world.scheduler, choices, world.clock_now)
        self.providers = world.providers  # every part's, checked by D1, D2 and D3
        self.providers.update(mail=self.mail, hook=self.hook)
        retry = Retry(
            max_attempts=4, base_delay=timedelta(seconds=1), max_delay=timedelta(seconds=10)
        )
        box.channel("mail", self.mail, retry=retry, batch_size=2)
        box.channel("hook", self.hook, retry=retry, ambiguity="hold", batch_size=2)

        @box.task(key=NOTICE_KEY, retry=retry, timeout=timedelta(seconds=60))
        def notice(ctx: JobContext, customer: int, period: str) -> None:
            self.runs[(ctx.job_id or 0, ctx.attempt)] += 1
            address = f"customer-{customer}@example.com"
            body = {"from": "ops@example.com", "to": address, "subject": period, "text": "hi"}
            ctx.connection.execute(
                "INSERT INTO sim_effects (key, job_id, attempt) VALUES (?, ?, ?)"
                if real.dialect == "sqlite"
                else "INSERT INTO sim_effects (key, job_id, attempt) VALUES (%s, %s, %s)",
                (NOTICE_KEY.format(customer=customer, period=period), ctx.job_id, ctx.attempt),
            )
            ctx.outbox.add("mail", body, suffix="mail")
            ctx.outbox.add("hook", {"customer": customer, "period": period}, suffix="hook")
            roll = choices.below(20)
            if NOTICE_KEY.format(customer=customer, period=period) == REFUSED:
                return  # the refusal is the database's alone: nothing else ends this job
            if roll == 0:
                raise RetryLater("the handler asked for later", timedelta(seconds=5))
            if roll == 1:
                raise RuntimeError("the handler failed")
            if roll == 2:
                raise Permanent("the handler refused for good")

        self.notice = notice

    def _business_table(self) -> None:
        """The handler's own effect, written through the claim's connection: one row per run
        whose transaction committed (`sim_effects`; no unique key, so a second commit shows)."""
        conn = self.world.real.connect()
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS sim_effects (key TEXT NOT NULL, job_id BIGINT, "
                "attempt INTEGER NOT NULL)"
            )
            conn.commit()
        finally:
            conn.close()

    def _refusal(self) -> None:
        """The database refuses `REFUSED`'s messages, inside the consumer's transaction: a write
        refused for what it holds, which no retry changes. Created or replaced: a PostgreSQL
        schema serves many worlds."""
        real = self.world.real
        conn = real.connect()
        try:
            if real.dialect == "sqlite":
                conn.execute(
                    "CREATE TRIGGER IF NOT EXISTS sim_refused BEFORE INSERT ON oncebox_outbox "
                    f"WHEN NEW.intent_key = '{REFUSED}' "
                    "BEGIN SELECT RAISE(ABORT, 'refused by the database'); END"
                )
            else:
                conn.execute(
                    "CREATE OR REPLACE FUNCTION sim_refused() RETURNS trigger LANGUAGE plpgsql "
                    "AS $$ BEGIN RAISE EXCEPTION 'refused by the database'; END $$"
                )
                conn.execute(
                    "CREATE OR REPLACE TRIGGER sim_refused BEFORE INSERT ON oncebox_outbox "
                    f"FOR EACH ROW WHEN (NEW.intent_key = '{REFUSED}') "
                    "EXECUTE FUNCTION sim_refused()"
                )
            conn.commit()
        finally:
            conn.close()

    def faults_stop(self) -> None:
        """From here a handler's runs are counted against A1."""
        self.runs.clear()
        self.quieted = True

    # -- the actors --------------------------------------------------------------------------

    def actors(self) -> Mapping[str, Starter]:
        loop = self.world.loop
        return {
            "enqueue": lambda: loop(self._enqueue_one),
            "enqueue-many": lambda: loop(self._enqueue_many),
        }

    def _key(self) -> tuple[int, str]:
        choices = self.world.choices
        return choices.below(CUSTOMERS), PERIODS[choices.below(len(PERIODS))]

    def _enqueue_one(self) -> None:
        customer, period = self._key()
        self.world.box.enqueue(self.notice, customer=customer, period=period)
        self.world.wanted.add(NOTICE_KEY.format(customer=customer, period=period))  # taken

    def _enqueue_many(self) -> None:
        rows = [self._key() for _ in range(1 + self.world.choices.below(3))]
        self.world.box.enqueue_many(self.notice, [{"customer": c, "period": p} for c, p in rows])
        self.world.wanted.update(NOTICE_KEY.format(customer=c, period=p) for c, p in rows)

    # -- what must hold ----------------------------------------------------------------------

    def after_step(self, rows: Rows) -> list[Violation]:
        found = self._copies(rows) + self._effects(rows) + self._tokens(rows)
        if self.quieted:  # A1: in its batch, then on its own when another job's writes failed
            found += [
                Violation("A1", f"job {job} ran its handler {count} times under attempt {attempt}")
                for (job, attempt), count in sorted(self.runs.items())
                if count > 2
            ]
        return found

    def _tokens(self, rows: Rows) -> list[Violation]:
        """D3: a message keeps its key's token for life, and every copy outside carries one."""
        found: list[Violation] = []
        tokens = set()
        secret = self.world.box.secret()
        for row_id, key, token, channel in rows(
            "SELECT id, key, token, channel FROM oncebox_outbox"
        ):
            tokens.add(token)
            if str(channel).startswith(RELAY_PREFIX):
                continue  # a relay's publish: written by the database's trigger (0016)
            original = str(key).removesuffix(f"~discarded-{row_id}")
            if token != derive_token(secret, original):
                found.append(
                    Violation("D3", f"message {row_id} ({original}) no longer has its key's token")
                )
        for name, provider in self.providers.items():
            for delivered in provider.deliveries:
                if delivered.token not in tokens:
                    found.append(
                        Violation("D3", f"{name} received a copy under a token no message has")
                    )
                elif delivered.key != idempotency_key(delivered.token):
                    found.append(
                        Violation("D3", f"{name} received a copy under another message's key")
                    )
        return found

    def _effects(self, rows: Rows) -> list[Violation]:
        found = []
        effects = Counter(key for (key,) in rows("SELECT key FROM sim_effects"))
        intents = {key for (key,) in rows("SELECT key FROM oncebox_intents")}
        for key, count in effects.items():
            if count > 1:
                found.append(
                    Violation("S3", f"{key}: its handler's effect committed {count} times")
                )
            if key not in intents:
                found.append(Violation("S3", f"{key}: an effect committed without its intent"))
        for job_id, attempt in rows(
            "SELECT e.job_id, e.attempt FROM sim_effects e JOIN oncebox_job_attempts a "
            "ON a.job_id = e.job_id AND a.attempt = e.attempt AND a.outcome = 'lease_expired'"
        ):
            found.append(
                Violation(
                    "F2", f"job {job_id} attempt {attempt} committed after its lease was rescued"
                )
            )
        return found

    def _copies(self, rows: Rows) -> list[Violation]:
        messages = rows("SELECT id, channel, token, state FROM oncebox_outbox")
        resent = Counter(
            int(target)
            for target, actor, action in rows(
                "SELECT target_id, actor, action FROM oncebox_audit WHERE target_kind = 'delivery'"
            )
            if action in RESENT_BY_A_PERSON and actor not in LANES
        )
        said_sent = {
            int(target)
            for (target,) in rows(
                "SELECT target_id FROM oncebox_audit WHERE action = 'resolve-sent'"
            )
        }
        found: list[Violation] = []
        copies = {name: provider.copies() for name, provider in self.providers.items()}
        for row_id, channel, token, state in messages:
            if channel not in copies:  # a channel of no simulated provider: nothing to count
                continue
            policy = self.world.box.channels[channel]
            if policy.ambiguity == "retry" and not policy.idempotent:
                continue  # it resends an unknown outcome, counted: D4 (`parts/reports.py`)
            got = copies[channel].get(token, 0)
            allowed = 1 + resent[int(row_id)]
            if got > allowed:
                found.append(
                    Violation(
                        "D1",
                        f"message {row_id} ({channel}, {state}) reached the outside {got} "
                        f"times; its policy allows {allowed}",
                    )
                )
            if state == "sent" and got == 0 and int(row_id) not in said_sent:
                found.append(
                    Violation("D2", f"message {row_id} ({channel}) is sent but never arrived")
                )
        return found

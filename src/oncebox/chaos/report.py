"""Running scenarios and reporting them: a table per run, per-key evidence for any violation,
and the command that runs the scenario again with the same seed."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TextIO

from oncebox.chaos.checker import Tally, check
from oncebox.chaos.private_broker import private_broker
from oncebox.chaos.private_nats import private_nats
from oncebox.chaos.private_server import private_server
from oncebox.chaos.runner import NotSettled, OwnBroker, run_context
from oncebox.chaos.scenarios import SCENARIOS, Scenario, Store
from oncebox.chaos.violation import Violation
from oncebox.kernel.clock import monotonic
from oncebox.kernel.errors import ConfigurationError
from oncebox.kernel.inert import redact

# the broker a scenario that restarts one gets, by the kind it runs on: never the machine's
PRIVATE_BROKERS: dict[str, Callable[[], contextlib.AbstractContextManager[OwnBroker]]] = {
    "rabbitmq": private_broker,
    "nats": private_nats,
}
PER_INVARIANT = 5  # violations printed per invariant; --json lists them all
COLUMNS = (
    ("eligible", "eligible"),
    ("delivered", "delivered"),
    ("duplicates_absorbed", "dups absorbed"),
    ("possible_duplicates", "possible dups"),
    ("actual_duplicates", "actual dups"),
    ("lost", "lost"),
    ("dead", "dead"),
    ("ambiguous", "ambiguous"),
)


@dataclass
class ScenarioResult:
    scenario: str
    store: str
    seed: int
    customers: int
    tally: Tally = field(default_factory=Tally)
    faults: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    seconds: float = 0.0
    mutations: tuple[str, ...] = ()
    settled_s: float | None = None  # real-clock runs: faults' end to every key visible
    bound_s: float | None = None  # ... and the bound it had to be within

    @property
    def ok(self) -> bool:
        return not self.violations

    def rerun(self, server: str | None) -> str:
        parts = ["oncebox chaos", f"--scenario {self.scenario}", f"--seed {self.seed}"]
        parts.append(f"--customers {self.customers}")
        if server and self.store == "postgres":
            parts.append(f"--db {redact(server)}")
        parts += [f"--mutation {m}" for m in self.mutations]
        return " ".join(parts)


def store_of(server: str | None) -> Store:
    return (
        "postgres" if server and server.split(":", 1)[0] in ("postgresql", "postgres") else "sqlite"
    )


def run_scenario(
    scenario: Scenario,
    *,
    server: str | None,
    customers: int,
    seed: int,
    mutations: tuple[str, ...] = (),
) -> ScenarioResult:
    """One scenario in a database of its own; the checker's verdict."""
    started = monotonic()
    settings = scenario.settings(server, customers, seed)
    settings.mutations = mutations
    result = ScenarioResult(scenario.name, store_of(server), seed, customers, mutations=mutations)
    with contextlib.ExitStack() as stack:
        if scenario.restarts_server and result.store == "postgres":
            # never the --db server: one of the run's own, which it may restart
            own = stack.enter_context(private_server())
            settings.server = own.url
        else:
            own = None
        node = None
        if scenario.restarts_broker:  # never the machine's broker: one of the run's own
            node = stack.enter_context(PRIVATE_BROKERS[scenario.broker]())
            settings.broker_url = node.url
        run = stack.enter_context(run_context(settings))
        run.server = own
        run.broker_node = node
        try:
            scenario.script(run)
        except NotSettled as exc:
            run.violation("L1 the system settles", scenario.name, str(exc))
        except Exception as exc:  # a lane that keeps failing stops the run: it did not settle
            run.violation(
                "L1 the system settles",
                scenario.name,
                f"the run stopped on {type(exc).__name__}: {str(exc)[:300]}",
            )
        result.settled_s, result.bound_s = run.settled_s, run.bound_s
        violations, result.tally = check(run)
        result.violations = run.violations + [v for v in violations if v not in run.violations]
        result.faults = run.faults
    result.seconds = round(monotonic() - started, 1)
    return result


def _restarts(scenario: Scenario, store: Store) -> bool:
    """Whether the scenario restarts a server (always a private one) on this store."""
    return store == "postgres" and (scenario.restarts_server or scenario.restarts_broker)


def select(
    name: str, store: Store, *, allow_server_restart: bool, soak: bool = False
) -> list[Scenario]:
    """`ci`: every scenario that needs no server restart and is not the soak; `all`: every
    scenario but the soak (restarts only when allowed); `soak` adds the soak."""
    if name in ("ci", "all"):
        chosen = [
            s
            for s in SCENARIOS.values()
            if (s.ci or (name == "all" and s.name != "soak"))
            and (allow_server_restart or not _restarts(s, store))
        ]
    elif name in SCENARIOS:
        chosen = [SCENARIOS[name]]
        if _restarts(chosen[0], store) and not allow_server_restart:
            what = "the broker" if chosen[0].restarts_broker else "the database server"
            raise ConfigurationError(f"scenario {name} restarts {what}: add --allow-server-restart")
    else:
        raise ConfigurationError(
            f"unknown scenario {name!r}; use ci, all, or one of: {', '.join(SCENARIOS)}"
        )
    if soak and SCENARIOS["soak"] not in chosen:
        chosen.append(SCENARIOS["soak"])
    return [s for s in chosen if store in s.stores]


def run_selected(
    name: str,
    *,
    server: str | None,
    customers: int,
    seed: int,
    mutations: tuple[str, ...] = (),
    allow_server_restart: bool = False,
    soak: bool = False,
    out: TextIO | None = None,
    as_json: bool = False,
) -> list[ScenarioResult]:
    out = out or sys.stdout
    store = store_of(server)
    results = []
    chosen = select(name, store, allow_server_restart=allow_server_restart, soak=soak)
    logger = logging.getLogger("oncebox")
    if logger.level == logging.NOTSET:  # faults make expected warnings; -v shows them
        logger.setLevel(logging.ERROR)
    for scenario in chosen:
        result = run_scenario(
            scenario, server=server, customers=customers, seed=seed, mutations=mutations
        )
        results.append(result)
        if not as_json:
            print_result(result, server, out)
    if as_json:
        out.write(json.dumps([_as_dict(r, server) for r in results], indent=2) + "\n")
    elif len(results) > 1:
        failed = [r.scenario for r in results if not r.ok]
        out.write(
            f"\n{len(results) - len(failed)} of {len(results)} scenarios held on {store}"
            + (f"; violated: {', '.join(failed)}\n" if failed else "\n")
        )
    return results


def print_result(result: ScenarioResult, server: str | None, out: TextIO) -> None:
    verdict = "ok" if result.ok else "VIOLATED"
    out.write(
        f"\n{result.scenario} · {result.store} · seed {result.seed} · "
        f"{result.seconds} s · {verdict}\n"
    )
    tally = asdict(result.tally)
    out.write("  " + "  ".join(f"{label:>13}" for _, label in COLUMNS) + f"  {'faults':>6}\n")
    out.write(
        "  "
        + "  ".join(f"{tally[name]:>13}" for name, _ in COLUMNS)
        + f"  {len(result.faults):>6}\n"
    )
    for fault in result.faults:
        out.write(f"  fault: {fault}\n")
    if result.bound_s is not None:
        settled = "never" if result.settled_s is None else f"in {result.settled_s:g} s"
        out.write(
            f"  real clock: settled {settled} after the faults (bound {result.bound_s:g} s)\n"
        )
    by_invariant: dict[str, list[Violation]] = {}
    for violation in result.violations:
        by_invariant.setdefault(violation.invariant, []).append(violation)
    for invariant, found in sorted(by_invariant.items()):
        for violation in found[:PER_INVARIANT]:
            out.write(f"  VIOLATION {invariant}: {violation.key}: {violation.evidence}\n")
        if len(found) > PER_INVARIANT:
            out.write(f"  … and {len(found) - PER_INVARIANT} more of {invariant} (--json: all)\n")
    if not result.ok:
        out.write(
            f"  run it again: {result.rerun(server)}\n"
            "  (the seed fixes the fault schedule, not the operating system's interleaving)\n"
        )


def _as_dict(result: ScenarioResult, server: str | None) -> dict[str, object]:
    return {
        "scenario": result.scenario,
        "store": result.store,
        "seed": result.seed,
        "customers": result.customers,
        "ok": result.ok,
        "seconds": result.seconds,
        **asdict(result.tally),
        "faults": result.faults,
        "violations": [asdict(v) for v in result.violations],
        "mutations": list(result.mutations),
        "settled_s": result.settled_s,
        "bound_s": result.bound_s,
        "rerun": result.rerun(server),
    }

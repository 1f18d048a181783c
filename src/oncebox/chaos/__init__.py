"""`oncebox chaos`: the failure-injection harness that shows the guarantees hold.

Each scenario runs the freight weekly digest in a database created for the run, with worker
processes that are killed, stopped, paused and disconnected at named points
(`oncebox.kernel.points`), and real providers on loopback (an idempotent HTTP email API and an SMTP
server). Most run on one clock for every process (the database's, moved by the harness); the
real-clock scenarios use none, with short leases and backoffs, and must settle within the bound
those imply. The checker then reads the database, the provider's log and the history of every send,
and reports per key what broke.

    workspace.py   the throwaway database             history.py    invoke/ok/fail/unknown log
    workload.py    the workload, its processes, the   recording.py  provider wrapper for history
                   real-clock timing                  checker.py    the invariants
    runner.py      RunContext: clock, spawn, drain,   rows.py       what the checker reads
                   settle on the real clock           mutations.py  breakages that must make a
    scenarios.py   the scenarios                                    scenario or a test fail
    report.py      the table and JSON                 switches.py   their process-wide patches
                                                      violation.py  one broken invariant
"""

from __future__ import annotations

from oncebox.chaos.report import ScenarioResult, run_scenario, run_selected
from oncebox.chaos.scenarios import SCENARIOS, Scenario

__all__ = ["SCENARIOS", "Scenario", "ScenarioResult", "run_scenario", "run_selected"]

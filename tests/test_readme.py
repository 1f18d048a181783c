"""The README's first example runs as pasted into an empty directory — no database, no
environment — prints what its README says it prints, sends one email for customer 42 however
often it runs, and is importable by a worker without running its demonstration."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from email import message_from_bytes
from pathlib import Path

from support.host_clock import README_WEEK_THURSDAY, host_clock_at

README = Path(__file__).resolve().parent.parent / "README.md"
CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("ONCEBOX_")}


def readme_section() -> str:
    text = README.read_text()
    return text[text.index("## Twenty lines") : text.index("## What is guaranteed")]


def readme_example() -> str:
    match = re.search(r"```python\n(.*?)```", readme_section(), re.S)
    assert match is not None
    return match.group(1)


def readme_output() -> list[str]:
    """The output the README shows for `python freight.py`, without its `$` line."""
    match = re.search(r"```\n\$ python freight.py\n(.*?)```", readme_section(), re.S)
    assert match is not None
    return match.group(1).splitlines()


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`args` in `cwd` as a new user runs them — on an ordinary day: the README shows what the
    example prints then, not on a Monday just after its schedule's 09:00 fire, when its worker
    rightly fans out that week too."""
    env = {**CLEAN, **host_clock_at(README_WEEK_THURSDAY, CLEAN.get("PYTHONPATH", ""))}
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=120
    )


def test_the_readme_example_runs_as_pasted_and_prints_what_the_readme_shows(tmp_path):
    code = readme_example()
    assert len(code.strip().splitlines()) <= 24, "the README promises about twenty lines"
    (tmp_path / "freight.py").write_text(code)
    first = run([sys.executable, "freight.py"], tmp_path)
    assert first.returncode == 0, first.stderr
    expected = readme_output()
    notice = expected[0].replace("/home/me/freight", str(tmp_path))
    assert first.stderr.strip() == notice  # it says which database it chose, and where
    assert first.stdout.splitlines() == expected[1:]
    [mail] = [message_from_bytes(p.read_bytes()) for p in tmp_path.glob("oncebox-outbox/*.eml")]
    assert mail["To"] == "ops@customer-42.example"
    assert mail["Subject"] == "Your shipments, 2026-W33"

    again = run([sys.executable, "freight.py"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert "was already claimed by job 1" in again.stdout
    assert len(list(tmp_path.glob("oncebox-outbox/*.eml"))) == 1  # nothing sent twice


def test_a_worker_imports_the_example_without_running_its_demonstration(tmp_path):
    (tmp_path / "freight.py").write_text(readme_example())
    worker = run(
        [sys.executable, "-m", "oncebox.cli", "worker", "--app", "freight", "--until-idle"],
        tmp_path,
    )
    assert worker.returncode == 0, worker.stderr
    assert worker.stdout.splitlines()[-1].startswith("worker stopped: 0 completed")  # none ran
    assert not list(tmp_path.glob("oncebox-outbox/*.eml"))

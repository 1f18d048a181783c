"""Running a README's commands as a reader pastes them into one terminal.

A README marks the fenced `sh` blocks a test runs, and what they print:

    <!-- run -->
    ```sh
    export PORT=8000
    ```

    <!-- run: serves PORT -->
    ```sh
    uvicorn app:app --port "$PORT" &
    ```

    <!-- run: exits 3 -->
    ```sh
    oncebox worker --app app --until-idle
    ```

    <!-- output -->
    ```
    remaining, by the database's clock (…):
    ```

`run` blocks must succeed, every command of them; `exits N` blocks end with a command that exits
N (and nothing else fails); after a `serves VAR` block the test waits until the port in `$VAR`
answers. An `output` block belongs to the run block before it: its lines must appear, in order
and masked as the docs' samples are (`support.doc_samples.mask`), in what that block printed
(a server in the background may print between them, as it would in the reader's terminal).
Blocks without a marker (building the environment, variants in prose) are not run.

All blocks run in one bash session, as typed: `export`, `cd` and background jobs carry from one
block to the next. A test may replace the value of a variable the README exports (a free port,
a database of its own) — only there, so every command stays as the README has it.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from support.doc_samples import mask
from support.waiting import wait_until

MARKED = re.compile(
    r"^<!-- (?P<marker>run|output)(?:: (?P<how>[^>]*?))? -->\n```(?P<lang>[^\n]*)\n"
    r"(?P<body>.*?)^```$",
    re.M | re.S,
)
STEP_TIMEOUT = 120.0  # seconds for one block: a loaded 2-core CI machine is slow
SERVE_TIMEOUT = 60.0


@dataclass
class Step:
    """One marked `sh` block: its text, what it must do, and the output the README shows."""

    where: str
    text: str
    exits: int = 0
    serves: str | None = None  # the variable that names the port it listens on
    shown: str | None = None


def steps(readme: Path) -> list[Step]:
    text = readme.read_text()
    found: list[Step] = []
    for match in MARKED.finditer(text):
        where = f"{readme.parent.name}/{readme.name}:{text[: match.start()].count(chr(10)) + 1}"
        how = (match["how"] or "").split()
        if match["marker"] == "output":
            if not found or found[-1].shown is not None:
                raise AssertionError(f"{where}: an output block without a run block before it")
            found[-1].shown = match["body"]
            continue
        if match["lang"] != "sh":
            raise AssertionError(f"{where}: a run marker before a ```{match['lang']} block")
        step = Step(where, match["body"])
        match how:
            case []:
                pass
            case ["exits", code] if code.isdigit():
                step.exits = int(code)
            case ["serves", variable]:
                step.serves = variable
            case _:
                raise AssertionError(f"{where}: unknown run marker {match['how']!r}")
        found.append(step)
    return found


def substitute(found: list[Step], values: Mapping[str, str]) -> list[Step]:
    """The steps with `export NAME=…` given `values[NAME]`; each name must be exported exactly
    once, or the README changed under the test."""
    seen = dict.fromkeys(values, 0)
    replaced = []
    for step in found:
        lines = []
        for original in step.text.split("\n"):
            line = original
            if line.startswith("export "):
                for name, value in values.items():
                    pattern = re.compile(rf"(?<=\s){name}=\S+")
                    line, count = pattern.subn(f"{name}={shlex.quote(value)}", line)
                    seen[name] += count
            lines.append(line)
        replaced.append(Step(step.where, "\n".join(lines), step.exits, step.serves, step.shown))
    wrong = {name: count for name, count in seen.items() if count != 1}
    assert not wrong, f"the README should export each of these once: {wrong}"
    return replaced


def missing_lines(shown: str, printed: str) -> list[str]:
    """The lines of `shown` that `printed` lacks, looking in order, each within a line (masked)."""
    wanted = [line.strip() for line in mask(shown).split("\n") if line.strip()]
    lines = iter(mask(printed).split("\n"))
    return [line for line in wanted if not any(line in got for got in lines)]


@dataclass
class Shell:
    """One bash session: the reader's terminal. Every failing command is reported through an
    ERR trap, each block ends with a line carrying a random marker and its exit status."""

    cwd: Path
    env: dict[str, str]
    scripts: Path
    values: Mapping[str, str]

    def __post_init__(self) -> None:
        self.marker = f"__readme_{uuid.uuid4().hex}__"
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its background jobs too: stopped together at the end
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, name="readme-shell", daemon=True)
        self.reader.start()
        self._send(
            "set -o pipefail\n"
            f'trap \'printf "\\n{self.marker} failed %s %s\\n" "$?" "$BASH_COMMAND"\' ERR\n'
        )

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _send(self, text: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(text)
        self.process.stdin.flush()

    def run(self, step: Step, number: int) -> str:
        """Run one block; fail unless it did what its marker says. Returns what it printed."""
        script = self.scripts / f"step-{number:02}.sh"
        script.write_text(step.text)
        self._send(
            f"__readme_step={shlex.quote(str(script))}\n"
            f'source "$__readme_step" </dev/null\n'
            f"printf '\\n{self.marker} done %s\\n' \"$?\"\n"
        )
        printed: list[str] = []
        failures: list[tuple[int, str]] = []
        deadline = time.monotonic() + STEP_TIMEOUT
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(self._story(step, printed, "did not finish in time")) from None
            if line is None:
                raise AssertionError(self._story(step, printed, "the shell exited"))
            head, found, tail = line.partition(self.marker)
            if not found:
                printed.append(line)
                continue
            if head:
                printed.append(head)
            what, _, rest = tail.strip().partition(" ")
            code, _, command = rest.partition(" ")
            if what == "done":
                status = int(code)
                break
            if "__readme_step" not in command:
                failures.append((int(code), command))
        expected = [] if step.exits == 0 else [step.exits]
        if [code for code, _ in failures] != expected or status != step.exits:
            raise AssertionError(
                self._story(step, printed, f"should exit {step.exits}; failed: {failures}")
            )
        if step.serves:
            port = int(self.values[step.serves])
            try:
                wait_until(lambda: answers(port), timeout=SERVE_TIMEOUT, what=f"port {port}")
            except AssertionError as never:
                printed.extend(self._pending())
                raise AssertionError(self._story(step, printed, str(never))) from None
        output = "\n".join(printed)
        if step.shown is not None:
            missing = missing_lines(step.shown, output)
            assert not missing, self._story(step, printed, f"printed none of {missing}")
        return output

    def _pending(self) -> list[str]:
        """What the session printed since, without waiting (a background server's last words)."""
        lines: list[str] = []
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return lines
            if line is not None:
                lines.append(line)

    def _story(self, step: Step, printed: list[str], what: str) -> str:
        return (
            f"{step.where}: {what}\n--- the block ---\n{step.text}--- what it printed ---\n"
            + "\n".join(printed)
        )

    def close(self) -> None:
        """The session ends (stdin closed) and whatever it left running is stopped."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)  # at once, unless a block is still running
        stop_group(self.process.pid)
        self.reader.join(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def stop_group(pgid: int) -> None:
    """SIGTERM to the session's process group (the servers a failed test left), then SIGKILL
    to what is still there once they had time to stop."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        try:
            wait_until(lambda: not group_alive(pgid), timeout=10, what="the session to stop")
            return
        except AssertionError:
            continue


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def session(
    cwd: Path, env: dict[str, str], scripts: Path, values: Mapping[str, str]
) -> Iterator[Shell]:
    shell = Shell(cwd, env, scripts, values)
    try:
        yield shell
    finally:
        shell.close()

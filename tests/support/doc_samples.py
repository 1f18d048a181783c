"""The machinery behind the docs' command samples: running a command as a user types it, in a
`Story` (one shell session), rendering what it printed, finding the marked blocks in the
Markdown, and masking what no two runs share.

A sample block is the fenced block right after a marker line:

    <!-- sample: enqueue-held enqueue-claimed -->
    ```
    $ oncebox enqueue …
    …
    ```

naming the recorded samples it shows, in order, separated by a blank line. Blocks without a
marker (usage synopses, shell recipes, excerpts nobody can re-run) are left alone.

The docs hold one real run's output as printed. What differs from run to run — instants,
durations, host:pid worker names, the random secret's tokens, the temporary directory, the scripted
SMTP server's port, the demo's progress lines — is masked on both sides before comparing
(`mask`), so a hand edit or a change in the commands' output fails the comparison, and a new run
does not.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import oncebox
from oncebox.kernel.clock import real_now
from support.host_clock import STORY_CLOCK

DOCS = Path(__file__).resolve().parents[2] / "docs"
STORY_PREFIX = "oncebox-doc-story-"
MARKER = re.compile(
    r"^(?P<indent> *)<!-- sample: (?P<names>[\w\- ]+) -->\n(?P=indent)```[^\n]*\n"
    r"(?P<content>.*?)^(?P=indent)```$",
    re.M | re.S,
)
COMMAND_TIMEOUT = 120
READERS = 4  # read-only commands run this many at a time


def oncebox_command() -> list[str]:
    """The `oncebox` script of this interpreter's environment — what a user types, so usage
    lines read `Usage: oncebox …` — else the module."""
    script = Path(sys.executable).with_name("oncebox")
    return [str(script)] if script.exists() else [sys.executable, "-m", "oncebox.cli"]


def pin_story_clock(instant: datetime) -> None:
    """From now on, every command this process runs reads the host's clock as if this moment
    were `instant` (support/story_clock): the story's rows are as old when it prints them as when
    its samples were written, on any later day."""
    shift = instant - real_now()
    os.environ["STORY_CLOCK_SHIFT_US"] = str(shift // timedelta(microseconds=1))


def base_environment() -> dict[str, str]:
    """This environment without any oncebox setting, as a fresh shell would have it; unbuffered,
    so stdout and stderr interleave in one pipe as they would on a terminal. The commands run
    the oncebox this process imports (a checkout's own `src`, when it is not the installed one),
    on the story's clock once `pin_story_clock` has set it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEBOX_")}
    source = str(Path(oncebox.__file__ or "").resolve().parent.parent)
    env["PYTHONPATH"] = f"{STORY_CLOCK}{os.pathsep}{source}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass(frozen=True)
class Shorten:
    """How a long output is shortened for the page, with `…` where something was left out:
    a JSON list to its first `items`, JSON strings to `strings` characters, and a traceback's
    frames to one line (they name files and line numbers of the machine that ran them)."""

    items: int | None = None
    strings: int | None = None


@dataclass
class Run:
    """One command as the docs show it: `$ ENV=… oncebox ARGS  # comment`, and what it printed
    (stdout and stderr in one stream, as on a terminal)."""

    args: Sequence[str]
    shown_env: Mapping[str, str] = field(default_factory=dict)
    comment: str = ""
    returncode: int = 0
    output: str = ""

    def prompt(self) -> str:
        prefix = "".join(f"{k}={shlex.quote(v) if v else ''} " for k, v in self.shown_env.items())
        line = f"$ {prefix}oncebox {shlex.join(self.args)}"
        return f"{line}  # {self.comment}" if self.comment else line


def run_command(args: Sequence[str], *, cwd: Path, env: Mapping[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*oncebox_command(), *args],
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen[str], already: str = "") -> tuple[int, str]:
    """Its exit code and everything it printed (after `already`, what was read of it so far)."""
    try:
        output, _ = process.communicate(timeout=COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    return process.returncode, already + output


def render(run: Run, shorten: Shorten | None = None, *, prompt: bool = True) -> str:
    """The block text of one run: its `$` line, then its output, trailing blanks dropped."""
    output = shorten_output(run.output, shorten) if shorten else run.output
    lines = ([run.prompt()] if prompt else []) + [
        line.rstrip() for line in output.rstrip("\n").split("\n") if output.strip()
    ]
    return "\n".join(lines)


TRACEBACK_FRAME = re.compile(r'(?m)^( *)File "[^"\n]*", line \d+, in [^\n]*\n(?:\1  [^\n]*\n)*')


def elide_frames(text: str) -> str:
    """Traceback frames become one `…` line per traceback: they name paths and line numbers
    of the machine and the version that ran them."""
    collapsed = TRACEBACK_FRAME.sub(lambda m: f"{m.group(1)}…\n", text)
    return re.sub(r"(?m)^( *)…\n(?:\1…\n)+", lambda m: f"{m.group(1)}…\n", collapsed)


def shorten_output(output: str, shorten: Shorten) -> str:
    try:
        value = json.loads(output)
    except ValueError:
        return elide_frames(output)
    return _dump(_shorten_json(value, shorten, top=True))


def _shorten_json(value: Any, shorten: Shorten, *, top: bool = False) -> Any:
    if isinstance(value, str):
        value = elide_frames(value)
        if shorten.strings is not None and len(value) > shorten.strings:
            return value[: shorten.strings] + "…"
        return value
    if isinstance(value, list):
        kept = value if not top or shorten.items is None else value[: shorten.items]
        items = [_shorten_json(item, shorten) for item in kept]
        return [*items, _ELLIPSIS] if len(kept) < len(value) else items
    if isinstance(value, dict):
        return {k: _shorten_json(v, shorten) for k, v in value.items()}
    return value


_ELLIPSIS = "\x00…"


def _dump(value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return text.replace(json.dumps(_ELLIPSIS, ensure_ascii=False), "…")


# -- masks ---------------------------------------------------------------------------------------

_MASKS: list[tuple[re.Pattern[str], str]] = [
    # the story's temporary directory, wherever the machine keeps its temporary files
    (re.compile(rf"/[^\s'\"]*?/{STORY_PREFIX}[\w]+"), "<story>"),
    # instants: ISO 8601 with or without fractions and offset, log lines' local time, mail dates,
    # the key guard's "since 2026-11-30 09:00 UTC"
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d([.,]\d+)?)?(Z|[+-]\d\d:\d\d| UTC)?"), "<t>"),
    (re.compile(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d [+-]\d{4}"), "<t>"),
    # durations: "in 29m", "waiting 45s", "time 1.4 s", "settled in 4.28 s", "_age_s": 1.25
    (re.compile(r"\b\d+\.\d+ s\b"), "<s>"),
    (re.compile(r"\b(in|waiting|pending) \d+[smhd]\b"), r"\1 <age>"),
    (re.compile(r"\b\d+[smhd] ago\b"), "<age> ago"),
    (re.compile(r'("\w+_age_s": )[\d.]+'), r"\1<s>"),
    # worker names (host:pid:lane) and clock owners (host:pid)
    (re.compile(r"[\w.-]+:\d+:[a-z]+\d+\b"), "<worker>"),
    (re.compile(r"(by |\"owner\": \")[\w.-]+:\d+\b"), r"\1<owner>"),
    # tokens: HMACs under the demo's random secret
    (re.compile(r"\b[0-9a-f]{32}\b"), "<token>"),
    # the scripted SMTP server takes a free port when 2525 is taken
    (re.compile(r"(smtp://127\.0\.0\.1:)\d+"), r"\1<port>"),
    # messages given back to wait for the rate limit: how many depends on the machine's pace
    (re.compile(r'("sends_waited": )\d+'), r"\1<n>"),
]
_PROGRESS = re.compile(r"^  digests sent: \d+/\d+$")


def mask(text: str) -> str:
    """The text with what no two runs share replaced by placeholders: see the module's
    docstring. Runs of spaces count as two, as a table's alignment follows the widths of what
    was masked. Only the last progress line stays: how many digests a run had sent when it
    looked depends on the machine's speed; what it sent in the end does not."""
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    lines = text.split("\n")
    progress = [i for i, line in enumerate(lines) if _PROGRESS.match(line)]
    lines = [line for i, line in enumerate(lines) if i not in progress[:-1]]
    return re.sub(r" {2,}", "  ", "\n".join(lines))


# -- the Markdown side ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """A marked block of a page: which samples it shows, and where it is."""

    path: Path
    names: tuple[str, ...]
    text: str  # the block's content, without its fences and its indentation (in a list item)
    indent: str
    start: int  # offsets of the content in the file
    end: int

    @property
    def where(self) -> str:
        line = self.path.read_text()[: self.start].count("\n") + 1
        return f"{self.path.name}:{line} ({' '.join(self.names)})"


def blocks(path: Path) -> Iterator[Block]:
    text = path.read_text()
    for match in MARKER.finditer(text):
        indent = match["indent"]
        lines = match["content"].rstrip("\n").split("\n")
        content = "\n".join(line.removeprefix(indent) for line in lines)
        yield Block(path, tuple(match["names"].split()), content, indent, *match.span("content"))


def expected(block: Block, samples: Mapping[str, str]) -> str:
    return "\n\n".join(samples[name] for name in block.names)


def rewrite(path: Path, samples: Mapping[str, str], *, every: bool = False) -> list[str]:
    """Put each marked block's recorded samples in place; unless `every`, a block that already
    says the same modulo the masks keeps its text, so a new run does not churn every instant in
    the docs. Returns the blocks rewritten."""
    text = path.read_text()
    changed: list[str] = []
    for block in sorted(blocks(path), key=lambda b: b.start, reverse=True):
        new = expected(block, samples)
        if (every and new != block.text) or mask(new) != mask(block.text):
            indented = "\n".join(block.indent + line if line else line for line in new.split("\n"))
            text = text[: block.start] + indented + "\n" + text[block.end :]
            changed.append(block.where)
    path.write_text(text)
    return changed


def stop(process: subprocess.Popen[str]) -> None:
    """SIGSTOP: the process stays where it is until `resume`."""
    process.send_signal(signal.SIGSTOP)


def resume(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGCONT)


# -- the story's session -------------------------------------------------------------------------


class StoryError(AssertionError):
    """The story did not go as written: a command exited otherwise than the docs say."""


@dataclass
class Story:
    """One shell session in `cwd`: `export`ed variables, then commands. Each command's sample is
    kept under its name; the docs show some, and tell in prose what the others did (they set the
    scene)."""

    cwd: Path
    exported: dict[str, str]
    samples: dict[str, str] = field(default_factory=dict)
    runs: dict[str, Run] = field(default_factory=dict)
    _batch: list[tuple[str, Run, Shorten | None]] | None = None

    def env(self, shown: Mapping[str, str]) -> dict[str, str]:
        """As the shell passes them: `ONCEBOX_APP= oncebox …` sets it empty, which the commands
        read as unset."""
        return {**base_environment(), **self.exported, **shown}

    def cmd(
        self,
        name: str,
        line: str,
        *,
        env: Mapping[str, str] | None = None,
        comment: str = "",
        code: int = 0,
        shorten: Shorten | None = None,
    ) -> None:
        """Run `oncebox LINE` (shell words) with `env` on top of the exported variables, shown
        as `ENV=… ` before it; `code` is the exit code the story expects."""
        run = Run(shlex.split(line), dict(env or {}), comment, code)
        if self._batch is not None:
            self._batch.append((name, run, shorten))
            return
        self.record(name, run, shorten, *finish(self.start(run)))

    def start(self, run: Run) -> subprocess.Popen[str]:
        return run_command(run.args, cwd=self.cwd, env=self.env(run.shown_env))

    def record(
        self, name: str, run: Run, shorten: Shorten | None, returncode: int, output: str
    ) -> None:
        if returncode != run.returncode:
            raise StoryError(
                f"{name}: `{run.prompt()}` exited {returncode}, the story expects "
                f"{run.returncode}:\n{output}"
            )
        run.output = output
        if name in self.runs:
            raise StoryError(f"two samples are named {name!r}")
        self.runs[name] = run
        self.samples[name] = render(run, shorten)

    @contextmanager
    def reads(self) -> Iterator[None]:
        """Commands that write nothing, run side by side: their output does not depend on one
        another, and the story is as slow as its slowest command, not their sum."""
        self._batch = []
        try:
            yield
            batch, self._batch = self._batch, None
            with ThreadPoolExecutor(READERS) as pool:
                futures = [
                    pool.submit(lambda run: finish(self.start(run)), run) for _, run, _ in batch
                ]
                for (name, run, shorten), future in zip(batch, futures, strict=True):
                    self.record(name, run, shorten, *future.result())
        finally:
            self._batch = None

    def view(self, name: str, of: str, *, keep: slice) -> None:
        """A sample that shows only some lines of another's output (a runbook excerpt)."""
        self.samples[name] = "\n".join(render(self.runs[of], prompt=False).split("\n")[keep])

    def with_exit_code(self, name: str) -> None:
        """Add `$ echo $?` and the code to a sample, for a command whose exit code is the point."""
        self.samples[name] += f"\n$ echo $?\n{self.runs[name].returncode}"

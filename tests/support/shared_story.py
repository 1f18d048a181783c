"""The docs' story (support/doc_story.py), run once per session however many processes test it.

The story runs every command the docs show, for over a minute; each pytest-xdist process that ran
a doc-sample test ran all of it. Now the controller starts it in the background when the session
starts (`start`), in a process holding a lock on the samples' file until it has written them, and
every test process takes them from there (`samples`): the story overlaps the first minutes of the
suite instead of holding processes up. Without a background run (one process, or a selection the
controller did not expect to need it), the first process to ask runs the story and the others
wait for it on the same lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
LOCK, KEPT, LOG = "doc-samples.lock", "doc-samples.json", "doc-samples.log"


def start(shared: Path) -> subprocess.Popen[bytes]:
    """The story in a process of its own, writing into `shared`; the lock is taken here, before
    any test process can look, and held by the child until it exits (`stop` at the session's
    end)."""
    shared.mkdir(parents=True, exist_ok=True)
    with (shared / LOCK).open("w") as lock, (shared / LOG).open("w") as log:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.Popen(
            [sys.executable, "-m", "support.shared_story", str(shared)],
            cwd=TESTS,
            env={**os.environ, "PYTHONPATH": str(TESTS)},
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(lock.fileno(),),
            start_new_session=True,  # a Ctrl-C of the suite is not the story's to answer
        )
    # the parent's descriptor is closed here; the lock lives on in the child's copy


def stop(story: subprocess.Popen[bytes]) -> None:
    """At the session's end: a story no test waited for (a selection without doc samples, an
    interrupted run) is stopped, and every story is reaped."""
    if story.poll() is None:
        story.kill()
    story.wait()


def samples(shared: Path) -> dict[str, str]:
    """The story's samples: from the background run when it wrote them, else recorded here."""
    from support.doc_story import record

    shared.mkdir(parents=True, exist_ok=True)
    with (shared / LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # waits for the background run, or another process
        kept = shared / KEPT
        if not kept.exists():  # nobody ran it, or the background run failed: its error comes here
            kept.write_text(json.dumps(record()))
        recorded: dict[str, str] = json.loads(kept.read_text())
        return recorded


def _run(shared: Path) -> None:
    from support.doc_story import record

    (shared / KEPT).write_text(json.dumps(record()))


if __name__ == "__main__":
    _run(Path(sys.argv[1]))  # the inherited lock is released when this process ends

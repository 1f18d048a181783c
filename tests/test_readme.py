"""The README's example runs as written: a reader who copies it gets one email for customer 42,
however many times it is enqueued."""

from __future__ import annotations

import re
import sqlite3
from email import message_from_bytes
from pathlib import Path

from oncebox import Box

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_example() -> str:
    text = README.read_text()
    section = text[text.index("## Twenty lines") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def test_the_readme_example_is_at_most_twenty_odd_lines_and_sends_one_email(tmp_path, monkeypatch):
    code = readme_example()
    assert len(code.strip().splitlines()) <= 22
    db = tmp_path / "freight.db"
    sqlite3.connect(db).execute(
        "CREATE TABLE customers (id INTEGER, active INTEGER)"
    ).connection.commit()
    monkeypatch.setenv("ONCEBOX_DB", f"sqlite:///{db}")
    monkeypatch.setenv("ONCEBOX_EMAIL", f"file://{tmp_path / 'mail'}")
    monkeypatch.delenv("ONCEBOX_SECRET", raising=False)
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 (run as a reader would)
    box = namespace["box"]
    assert isinstance(box, Box)
    try:
        [mail] = [message_from_bytes(p.read_bytes()) for p in (tmp_path / "mail").glob("*.eml")]
        assert mail["To"] == "ops@customer-42.example"
        assert mail["Subject"] == "Your shipments, 2026-W33"
        [job] = box.store.job_find_by_key("weekly-digest/customer-42/2026-W33")
        assert (job.state, job.outcome) == ("done", "completed")
    finally:
        box.close()

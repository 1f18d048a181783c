"""Running a peer's benchmark script in the peers' own interpreter (.venv-peers, `make peers-env`).

The peers never share oncebox's environment; each script under bench/peers/ takes `--server` and
prints its figures as one JSON object on its last stdout line.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"


def run_peer(
    name: str, script: str, server: str, args: list[str], timeout: float
) -> dict[str, Any]:
    """Run bench/peers/`script` against `server`; its figures, or SystemExit naming the peer."""
    command = [str(PEERS_PYTHON), str(ROOT / "bench" / "peers" / script), "--server", server]
    result = subprocess.run(
        [*command, *args], check=False, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise SystemExit(f"{name} failed: {result.stderr.strip().splitlines()[-1:]}")
    figures: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures

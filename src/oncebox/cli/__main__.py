from __future__ import annotations

from oncebox.cli.app import main

main()

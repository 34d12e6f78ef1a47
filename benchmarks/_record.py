"""Write one benchmark's section into results/benchmarks.md (replacing its previous version)."""

from __future__ import annotations

import datetime as _dt
import platform
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results" / "benchmarks.md"
HEADER = "# Benchmarks\n\nEach section is written by the script named in it; rerun the command to refresh it.\n"


def machine() -> str:
    import os

    import torch

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, torch {torch.__version__}"


def record(section: str, body: str) -> None:
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    stamp = _dt.date.today().isoformat()
    block = f"## {section}\n\n_{stamp}, {machine()}_\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(section)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: block + "\n", text)
    else:
        text = text.rstrip() + "\n\n" + block
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text.rstrip() + "\n")

"""``python -m harness.tasks table``: print the task sources table of ``docs/tasks.md``,
generated from the sources' declarations."""

from __future__ import annotations

import sys

from harness.tasks.registry import sources_markdown

if __name__ == "__main__":
    if sys.argv[1:] != ["table"]:
        print("usage: python -m harness.tasks table", file=sys.stderr)
        raise SystemExit(2)
    print(sources_markdown(), end="")

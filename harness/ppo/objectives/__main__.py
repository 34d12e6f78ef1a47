"""``python -m harness.ppo.objectives readme|objectives|metrics``: print the objectives table,
``docs/objectives.md`` (the table as a page) or ``docs/metrics.md``, all generated from the
registry."""

from __future__ import annotations

import sys

from harness.ppo.objectives.docs import metrics_markdown, objectives_markdown, objectives_page

PAGES = {"readme": objectives_markdown, "objectives": objectives_page, "metrics": metrics_markdown}

if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what not in PAGES:
        print("usage: python -m harness.ppo.objectives readme|objectives|metrics", file=sys.stderr)
        raise SystemExit(2)
    print(PAGES[what](), end="")

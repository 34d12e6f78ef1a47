"""``python -m harness.ppo.objectives table|metrics``: print the objectives table (docs/objectives.md) or
``docs/metrics.md``, both generated from the registry."""

from __future__ import annotations

import sys

from harness.ppo.objectives.docs import metrics_markdown, objectives_markdown

if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what not in ("table", "metrics"):
        print("usage: python -m harness.ppo.objectives table|metrics", file=sys.stderr)
        raise SystemExit(2)
    print(objectives_markdown() if what == "table" else metrics_markdown(), end="")

"""``docs/metrics.md`` holds what each policy objective's statistics mean, declared by the
objectives (a layer above this one): generate it with ``python -m harness.ppo.objectives metrics``."""

import sys

print(
    "docs/metrics.md includes the objectives' declarations: "
    "python -m harness.ppo.objectives metrics > docs/metrics.md",
    file=sys.stderr,
)
raise SystemExit(2)

"""``python -m harness.metrics > docs/metrics.md``."""

from harness.metrics import markdown

print(markdown(), end="")

"""``python -m harness.ppo.corrections``: print docs/corrections.md."""

from __future__ import annotations

from harness.ppo.corrections.docs import markdown

if __name__ == "__main__":
    print(markdown(), end="")

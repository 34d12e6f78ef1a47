"""The tiny model most tests train: one layer of width 32, so a two-step run takes about a second
on a CPU.  One shape for all of them, as a ``tiny:`` mapping and as ``--set`` values."""

from __future__ import annotations

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}

# ``--set`` values (without the flag) of the tiny shape.
TINY_SETS = [f"tiny.{k}={v}" for k, v in TINY.items()]

# ``--set`` values of a two-step run of the tiny model: a later value of the same key wins, so a
# test adds what it needs after these.
FAST_RUN = [
    "steps=2",
    "rollout.prompts_per_step=2",
    "rollout.n_samples=2",
    "rollout.max_new_tokens=4",
    "eval.every=0",
    "eval.n_prompts=2",
    "threads=1",
    *TINY_SETS,
]


def set_flags(*values: str) -> list[str]:
    """``["--set", v1, "--set", v2, ...]``."""
    return [x for v in values for x in ("--set", v)]

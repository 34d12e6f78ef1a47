"""The tiny model most tests train: one layer of width 32, so a two-step run takes about a second
on a CPU.  One shape for all of them, as a ``tiny:`` mapping and as ``--set`` values."""

from __future__ import annotations

from typing import Any

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


def tiny_reverse(
    steps: int = 2,
    *,
    rollout: dict[str, Any] | None = None,
    ppo: dict[str, Any] | None = None,
    eval: dict[str, Any] | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The config mapping of a ``steps``-step run of the tiny model on ``reverse``, on one
    thread, sampling 2 prompts × 2 completions of at most 5 tokens a step.  ``rollout`` entries
    are added to (or replace) those; ``ppo`` and ``eval`` become blocks of their own when given,
    and any other key (``trainer``, ``optim``) is added as it is."""
    base: dict[str, Any] = {
        "steps": steps,
        "task": "reverse",
        "tiny": TINY,
        "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 5, **(rollout or {})},
    }
    if ppo is not None:
        base["ppo"] = ppo
    if eval is not None:
        base["eval"] = eval
    return {**base, **more, "threads": 1}


# ``--set`` values of a run of a model narrower than the tiny one (width 16) sampling 2 prompts ×
# 2 completions of at most 3 tokens, without evaluation; the number of steps is the caller's.
SMALL_SETS = [
    "rollout.prompts_per_step=2",
    "rollout.n_samples=2",
    "rollout.max_new_tokens=3",
    "eval.every=0",
    "eval.n_prompts=2",
    "tiny.hidden_size=16",
    "tiny.num_layers=1",
    "tiny.num_heads=2",
    "tiny.intermediate_size=16",
]

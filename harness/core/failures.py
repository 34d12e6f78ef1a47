"""Why runs failed, said once per distinct reason.

A sweep whose trials fail stores each trial's reason (Optuna ``reason`` attribute, MLflow
``run.reason`` tag); the console, ``harness status`` and the report group those reasons so that
ten seeds failing the same way are one line with a count, not ten lines or none.

Reasons are grouped after removing what differs between otherwise identical failures: the
prompt and completion a ``python:`` reward function was called with
(``f(prompt='8=', completion='j@') raised ZeroDivisionError`` is one failure whatever the prompt).
Pure functions only: callers read the reasons from wherever they live. And the one failure the
sweep must tell apart from a bug without loading torch, :class:`WarmStartDiverged`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# A repr()'d str: single- or double-quoted, with backslash escapes.
_QUOTED = r"""(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
_CALL_ARGS = re.compile(rf"\(prompt={_QUOTED}, completion={_QUOTED}\)")
MAX_REASON_CHARS = 300  # one console line per reason; the full text stays in Optuna/MLflow


class WarmStartDiverged(RuntimeError):
    """The supervised warm start left non-finite weights or loss (``harness.run.warmstart``):
    nothing is cached and the run fails with this reason, since a PPO divergence at step 0 would
    blame the cell for its start. A search that varies the warm start's settings rejects the
    point instead of stopping at it as at a bug."""


def reason_key(reason: str) -> str:
    """The reason with per-call details (the reward function's arguments) elided."""
    text = " ".join(reason.split()) or "no reason recorded"
    return _CALL_ARGS.sub("(prompt=..., completion=...)", text)


def count_reasons(reasons: Iterable[str]) -> list[tuple[str, int]]:
    """Distinct reasons (see :func:`reason_key`) with how many failures each hit; most frequent
    first, ties in order of first appearance."""
    counts: dict[str, int] = {}
    for r in reasons:
        key = reason_key(r)
        counts[key] = counts.get(key, 0) + 1
    order = {k: i for i, k in enumerate(counts)}
    return sorted(counts.items(), key=lambda kv: (-kv[1], order[kv[0]]))


def short_reason(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def reason_lines(counted: list[tuple[str, int]], what: str = "run") -> list[str]:
    """``'2 runs: RewardError: ...'`` per distinct reason."""
    return [f"{n} {what}{'s' if n != 1 else ''}: {short_reason(r)}" for r, n in counted]


def summary_lines(
    reasons: list[str], total: int, *, finished: int, what: str = "run", indent: str = "  "
) -> list[str]:
    """The console block of a study with failures: a headline, then one line per reason.
    Empty when nothing failed."""
    if not reasons:
        return []
    head = f"{len(reasons)} of {total} {what}s failed"
    if not finished:
        head += f" (no {what} completed)"
    return [head + ":"] + [indent + line for line in reason_lines(count_reasons(reasons), what)]

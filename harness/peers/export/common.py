"""What every export target shares: lines that stay one line, Python literals, and the notes
for harness settings no target's RL config holds (the warm start, the sampler's noise)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.config import RunConfig


def one_line(text: Any) -> str:
    """``text`` with every character that could end a line (in Python, YAML or a shell: \\n,
    \\r, \\x85, \\u2028, ...) or hide one (any other non-printable) written as its escape."""
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text)
    )


def comment(text: Any) -> str:
    """A ``#`` comment line that stays one line (and so stays a comment) whatever it quotes."""
    return "# " + one_line(text)


def py_literal(v: Any) -> str:
    """A Python literal of ``v`` (``repr``; ±inf as ``float('inf')``, which has no literal)."""
    if isinstance(v, float) and not math.isfinite(v):
        if math.isnan(v):
            raise ValueError("NaN has no exported value")
        return "float('inf')" if v > 0 else "-float('inf')"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(py_literal(x) for x in v) + "]"
    return repr(v)


def lora_targets(cfg: RunConfig) -> str | list[str]:
    """The LoRA target modules as peft takes them (the harness's ``[all-linear]`` is peft's
    ``"all-linear"`` shorthand, as in ``harness.model.lora.apply_lora``)."""
    lora = cfg.model_options.lora
    assert lora is not None
    targets = list(lora.target_modules)
    return "all-linear" if targets == ["all-linear"] else targets


def warm_start_note(cfg: RunConfig, target: str) -> list[str]:
    """The warm start is a separate supervised phase no target's RL config holds."""
    w = cfg.warm_start
    if not w.steps:
        return []
    return [
        f"# warm_start.steps={w.steps} (lr {w.lr}, batch_size {w.batch_size}): the harness "
        f"fine-tunes on the task's demonstrations before RL; {target}'s RL trainer has no such "
        "phase: run SFT first (e.g. TRL's SFTTrainer) and start RL from that checkpoint"
    ]


def sampler_notes(cfg: RunConfig, target: str, dtype_key: str | None) -> list[str]:
    """The harness's sampler-only settings: noise is a measurement knob no framework has; the
    sampler's precision is the rollout engine's dtype (``dtype_key``) where the target names
    one in its RL config."""
    r = cfg.rollout
    notes = []
    if r.sampler_logit_noise > 0:
        notes.append(
            f"# rollout.sampler_logit_noise={r.sampler_logit_noise}: {target} has no sampler "
            "noise (the harness adds it to dose the training-inference mismatch)"
        )
    if r.sampler_dtype is not None and dtype_key is None:
        notes.append(
            f"# rollout.sampler_dtype={r.sampler_dtype}: set the precision of {target}'s "
            "inference engine (SGLang/vLLM server config); not in its actor config"
        )
    return notes

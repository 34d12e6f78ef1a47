"""The prime-rl target: a TOML file for its ``rl`` entry point (``uv run rl @ cell.toml``).

Keys from PrimeIntellect-ai/prime-rl: ``src/prime_rl/configs/rl.py`` @ 539089285f96 (``RLConfig``:
the shared ``max_async_level``, the ``trainer`` and ``orchestrator`` tables),
``src/prime_rl/configs/orchestrator.py`` @ 0083212fadd5 (``OrchestratorConfig``: ``batch_size``
counts samples, ``rollouts_per_example``, ``strict_async_level``, ``max_off_policy_steps``,
``oversampling_factor``, ``max_concurrent``; ``SamplingConfig``: ``temperature``, ``max_tokens``)
and ``src/prime_rl/configs/trainer.py`` @ 0081765e6464 (``AdamWConfig``: ``lr``,
``weight_decay``, ``max_norm``, ``betas1``, ``betas2``; ``LoRAConfig``; the schedulers).

What is written: the asynchrony (:mod:`harness.peers.export.asynchrony`), the batch, sampling,
the optimizer and LoRA. prime-rl's loss (``trainer.loss``) is its own objective and is not
mapped: the harness's ``ppo.*`` settings a cell changes are named in ``#`` lines.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from harness.core.configtools import ConfigError
from harness.peers.export.asynchrony import primerl_async
from harness.peers.export.common import comment, sampler_notes, warm_start_note

if TYPE_CHECKING:
    from harness.config import RunConfig

PRIMERL_COMMIT = "0083212fadd5"


def _value(v: Any, where: str) -> str:
    """A TOML value (strings as basic strings: JSON's escapes are TOML's)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            raise ValueError("NaN has no exported value")
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x, where) for x in v) + "]"
    raise ConfigError(f"{where}: {v!r} cannot be written as TOML")


def toml(doc: dict[str, Any], prefix: str = "") -> list[str]:
    """``doc`` as TOML lines: its plain keys, then one table per nested dict (depth first)."""
    lines = [f"{k} = {_value(v, prefix + k)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            name = prefix + k
            # a table of tables only needs its children's headers (TOML defines it implicitly)
            if not v or any(not isinstance(x, dict) for x in v.values()):
                lines += ["", f"[{name}]"]
            lines += toml(v, name + ".")
    return lines


def _trainer(cfg: RunConfig) -> tuple[dict[str, Any], list[str]]:
    """``[trainer.optim]``, the scheduler where prime-rl has the harness's, and LoRA."""
    o, m = cfg.optim, cfg.model_options
    notes: list[str] = []
    trainer: dict[str, Any] = {
        "optim": {
            "type": "adamw",
            "lr": o.lr,
            "weight_decay": o.weight_decay,
            "betas1": o.beta1,
            "betas2": o.beta2,
            # prime-rl always clips; a norm no gradient reaches switches it off
            "max_norm": o.grad_clip if o.grad_clip is not None else 1e9,
        }
    }
    if o.schedule == "constant" and not o.warmup_steps:
        trainer["scheduler"] = {"type": "constant"}
    else:
        notes.append(
            f"# optim.schedule={o.schedule} (warmup_steps {o.warmup_steps}): prime-rl's "
            "trainer.scheduler decays over its own decay_steps / max_steps; set it there"
        )
    if m.lora is not None:
        targets = list(m.lora.target_modules)
        lora: dict[str, Any] = {"rank": m.lora.r, "alpha": float(m.lora.alpha)}
        lora["dropout"] = float(m.lora.dropout)
        if targets == ["all-linear"]:
            notes.append(
                "# model_options.lora.target_modules=[all-linear]: prime-rl names modules or "
                "regexes (its default: every attention and MLP projection)"
            )
        else:
            lora["target_modules"] = targets
        trainer["model"] = {"lora": lora}
    return trainer, notes


def _lacks(cfg: RunConfig) -> list[str]:
    """What this export does not write, said once: the loss, and the settings that only act
    together with another (the generic per-field notes cannot reset them one at a time)."""
    p, r = cfg.ppo, cfg.rollout
    notes = [
        f"# prime-rl @ {PRIMERL_COMMIT}: `uv run rl @ <this file>`; its loss (trainer.loss) is "
        "its own objective and the harness's ppo.* settings are not mapped to it"
    ]
    if p.correction is not None:
        # the thesis runs (configs/thesis/README.md @ 066c86b27d26) set these masks by hand
        notes.append(
            "# ppo.correction: prime-rl's trainer.loss has its own token, sequence and "
            "geometric masks (token_mask_low/high, sequence_mask_low/high, geo_mask_low/high); "
            "not mapped"
        )
    if p.overlong_reward_penalty:
        notes.append(
            f"# ppo.overlong_reward_penalty (overlong_tokens={p.overlong_tokens}, "
            f"overlong_penalty_factor={p.overlong_penalty_factor}): prime-rl shapes rewards in "
            "its environment (verifiers rubric), not in this config"
        )
    if r.zero_variance_filter:
        notes.append(
            f"# rollout.zero_variance_filter (max_resample_rounds {r.max_resample_rounds}): "
            "prime-rl's orchestrator.buffer.online_difficulty_filtering drops groups of reward "
            "0 or 1 only, and does not resample"
        )
    if r.top_p != 1.0:
        notes.append(f"# rollout.top_p={r.top_p}: prime-rl's training sampling config has no top_p")
    return notes


def export_primerl(cfg: RunConfig) -> str:
    """The cell as prime-rl's ``rl`` TOML, notes first."""
    r, p = cfg.rollout, cfg.ppo
    top, orch_async, notes = primerl_async(cfg)
    orchestrator: dict[str, Any] = {
        "batch_size": r.prompts_per_step * r.n_samples,  # prime-rl counts samples
        "rollouts_per_example": r.n_samples,
        **orch_async,
        "sampling": {"temperature": p.temperature, "max_tokens": r.max_new_tokens},
    }
    trainer, trainer_notes = _trainer(cfg)
    doc = {**top, "orchestrator": orchestrator, "trainer": trainer}
    notes = _lacks(cfg) + notes + trainer_notes
    notes += sampler_notes(cfg, "prime-rl", None)
    notes += warm_start_note(cfg, "prime-rl")
    lines = [comment(n.removeprefix("# ")) for n in notes]
    return "\n".join(lines + toml(doc)) + "\n"


__all__ = ["PRIMERL_COMMIT", "export_primerl", "toml"]

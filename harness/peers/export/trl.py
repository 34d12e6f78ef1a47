"""The TRL target: a Python snippet that builds ``GRPOConfig`` (TRL 1.16; the mapping is
:mod:`harness.peers.trl`) and, under LoRA, peft's ``LoraConfig`` for ``GRPOTrainer``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from harness.peers.export.asynchrony import trl_async
from harness.peers.export.common import (
    comment,
    lora_targets,
    py_literal,
    warm_start_note,
)
from harness.peers.trl import VLLM_ONLY, approximations, grpo_kwargs, trl_problems

if TYPE_CHECKING:
    from harness.config import RunConfig


def _trl_use_cpu(cfg: RunConfig) -> tuple[bool, str | None]:
    """``use_cpu`` for the cell's device (HF refuses ``bf16=True`` on a CPU-only machine unless
    it is told to train on the CPU).  ``auto`` is resolved on this machine, and says so."""
    dev = str(cfg.device).strip().lower()
    if dev == "cpu":
        return True, None
    if dev == "auto":
        cpu = not torch.cuda.is_available()
        return cpu, f"device auto: resolved on this machine ({'no CUDA' if cpu else 'CUDA'})"
    return False, None


def export_trl(cfg: RunConfig) -> str:
    """A snippet that builds TRL's ``GRPOConfig`` (and peft's ``LoraConfig`` under LoRA)."""
    problems = trl_problems(cfg)
    # The IS weights trainer: trl refuses (it samples without vLLM) are exported: a TRL run with
    # a vLLM sampler applies them.
    vllm_weights = [f for f, why in problems if why == VLLM_ONLY]
    lines = [
        comment(f"{field}: not expressible in TRL ({why})")
        for field, why in problems
        if why != VLLM_ONLY
    ]
    if vllm_weights:
        lines.append(
            comment(
                "ppo.correction: vllm_importance_sampling_* below take effect only with "
                "use_vllm=True (TRL weights by the vLLM sampler's log-probs)"
            )
        )
    lines += [comment(f"approximate: {a}") for a in approximations(cfg)]
    lines += [comment(n.removeprefix("# ")) for n in warm_start_note(cfg, "TRL")]
    p = cfg.ppo
    if p.overlong_reward_penalty:
        # The harness adds it inside the reward it hands TRL; an exported config cannot.
        lines.append(
            comment(
                f"ppo.overlong_reward_penalty (overlong_tokens={p.overlong_tokens}, "
                f"overlong_penalty_factor={p.overlong_penalty_factor}): not a GRPOConfig "
                "option; TRL has it as a reward function: add trl.rewards."
                f"get_soft_overlong_punishment(max_completion_len={cfg.rollout.max_new_tokens}, "
                f"soft_punish_cache={p.overlong_tokens}) to reward_funcs, weighted by the factor"
            )
        )
    if p.policy_loss == "vespo" and getattr(p, p.policy_loss).behaviour_weight == "fold":
        lines.append(
            comment(
                "ppo.vespo.behaviour_weight=fold: TRL's own VESPO composition (ρ folded into W, "
                "log W += clamp(log ρ, log 1e-8, 20) summed over a token ρ_t, once for a row's "
                "ρ_i; the loss is not multiplied by ρ)"
            )
        )
    kw = grpo_kwargs(cfg, strict=False)
    use_cpu, note = _trl_use_cpu(cfg)
    kw["use_cpu"] = use_cpu
    if note:
        lines.append(comment(note))
    lora = cfg.model_options.lora
    code = []
    if lora is not None:
        code.append("from peft import LoraConfig")
    code += ["from trl import GRPOConfig", ""]
    if lora is not None:
        lora_kw = {
            "r": lora.r,
            "lora_alpha": lora.alpha,
            "lora_dropout": lora.dropout,
            "target_modules": lora_targets(cfg),
            "bias": "none",
            "task_type": "CAUSAL_LM",
        }
        code.append(
            "peft_config = LoraConfig("
            + ", ".join(f"{k}={py_literal(v)}" for k, v in lora_kw.items())
            + ")"
        )
    code.append("args = GRPOConfig(")
    code += [f"    {k}={py_literal(v)}," for k, v in kw.items()]
    code.append(")")
    trainer = "GRPOTrainer(model=..., reward_funcs=..., args=args"
    trainer += ", peft_config=peft_config)" if lora is not None else ")"
    code.append(comment(f"then: {trainer}"))
    return "\n".join(lines + code + _async_code(cfg, kw)) + "\n"


def _async_code(cfg: RunConfig, kw: dict[str, object]) -> list[str]:
    """Under ``rollout.async``: the notes and ``async_args = AsyncGRPOConfig(...)`` for TRL's
    asynchronous trainer (nothing otherwise)."""
    async_kw, notes = trl_async(cfg, kw)
    if not async_kw:
        return []
    code = ["", *(comment(n.removeprefix("# ")) for n in notes)]
    code += ["from trl.experimental.async_grpo import AsyncGRPOConfig", ""]
    code.append("async_args = AsyncGRPOConfig(")
    code += [f"    {k}={py_literal(v)}," for k, v in async_kw.items()]
    code.append(")")
    trainer = "AsyncGRPOTrainer(model=..., reward_funcs=..., args=async_args"
    trainer += ", peft_config=peft_config)" if cfg.model_options.lora is not None else ")"
    code.append(comment(f"then: {trainer}"))
    return code

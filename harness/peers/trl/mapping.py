"""The table of ``docs/trl.md``: each harness option, the TRL 1.16 ``GRPOConfig`` field it
becomes, and how faithful that is (exact, approx, must, none: see :mod:`harness.peers.trl`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.ppo.objectives import OBJECTIVES

TRL_VERSION = "1.16"


@dataclass(frozen=True)
class MapRow:
    harness: str
    trl: str
    kind: str  # exact | approx | must | none
    note: str


def _policy_loss_note() -> str:
    """How each registered objective maps to TRL (from its declaration's ``trl`` peer)."""
    parts, missing = [], []
    for o in OBJECTIVES.values():
        peer = o.trl
        if peer is None:
            missing.append(o.name)
            continue
        if not peer.name:
            parts.append(f"{o.name} → {peer.note}")
            continue
        how = []
        if peer.aggregations:
            how.append(f"{' / '.join(peer.aggregations)} only")
        how += [f"{o.name}.{ours} → {theirs}" for ours, theirs in (peer.options or {}).items()]
        how += [f"{o.name}.{ours} must be {shown(v)}" for ours, (v, _) in peer.fixed.items()]
        parts.append(f"{o.name} → {peer.name}" + (f" ({', '.join(how)})" if how else ""))
    if missing:
        parts.append(f"{', '.join(missing)} have no TRL loss_type")
    return "; ".join(parts)


def shown(value: Any) -> str:
    """A value as the table and the messages write it (None is null)."""
    return "null" if value is None else str(value)


TRL_MAPPING: tuple[MapRow, ...] = (
    MapRow("ppo.eps_clip", "epsilon", "exact", "lower clip ε: r clipped below at 1−ε"),
    MapRow(
        "ppo.eps_clip_higher",
        "epsilon_high",
        "exact",
        "upper clip ε_hi; null → epsilon (TRL's own fallback)",
    ),
    MapRow(
        "ppo.c_clip",
        "delta",
        "must",
        "TRL clamps the unclipped ratio at δ before the min; for A<0 that caps the loss at δ·|A| "
        "with zero gradient beyond (the dual clip with c = δ); for A>0 it is inert only while "
        "δ ≥ 1+ε_hi, so c_clip must be > 1 + eps_clip_higher",
    ),
    MapRow(
        "ppo.importance_sampling_level",
        "importance_sampling_level",
        "exact",
        "token | sequence (both: geometric-mean sequence ratio, GSPO)",
    ),
    MapRow(
        "ppo.loss_agg_mode",
        "loss_type",
        "must",
        "token-mean → bnpo (token mean of each optimizer step's minibatch; exact with no gradient "
        "accumulation); seq-mean-token-mean → grpo; seq-mean-token-sum → luspo (per-sequence "
        "token sum, mean over sequences); seq-mean-token-sum-norm → dr_grpo (approx: TRL divides "
        "by max_completion_length, the harness by the minibatch's padded width); prompt-mean has no "
        "loss_type (an error)",
    ),
    MapRow(
        "ppo.top_entropy_quantile",
        "top_entropy_quantile",
        "exact",
        "ρ; the threshold is the (1−ρ) quantile of each optimizer step's valid tokens (TRL: of "
        "its micro-batch, the same rows with gradient_accumulation_steps 1); ties kept, "
        "denominators count every valid token, the entropy bonus acts on the kept tokens",
    ),
    MapRow(
        "ppo.truncated_completions",
        "mask_truncated_completions",
        "must",
        "keep → False, mask → True (a row without EOS leaves the loss; its reward still enters "
        "the group statistics); zero_reward (AReaL's mask_no_eos_with_zero) has no TRL option",
    ),
    MapRow(
        "ppo.overlong_reward_penalty / overlong_tokens / overlong_penalty_factor",
        "(reward function)",
        "exact",
        "AReaL's overlong penalty added inside the reward function the trainer hands TRL, from "
        "the completion's token count (EOS included), before reward_bias / scaling / clip",
    ),
    MapRow(
        "rollout.zero_variance_filter / max_resample_rounds",
        "-",
        "none",
        "GRPOTrainer has no group filter or refill (it only logs frac_reward_zero_std)",
    ),
    MapRow("ppo.policy_loss", "loss_type", "must", _policy_loss_note()),
    MapRow(
        "ppo.reward_norm",
        "scale_rewards",
        "must",
        "TRL always centres by the group mean: {mean_level: group, std_level: group} → group, "
        "{group, null} → none, {group, batch} → batch (approx: TRL's batch std is about the batch "
        "mean, the harness pools deviations from the group means); std is always Bessel-corrected "
        "with eps 1e-4 (approx when the harness eps differs); mean_leave1out and batch/no "
        "centering are errors; divide_by mean (MaxRL) is an error",
    ),
    MapRow("ppo.adv_norm", "-", "none", "TRL has no token-level advantage normalization"),
    MapRow(
        "ppo.ppo_epochs",
        "num_iterations",
        "exact",
        "passes over each generation batch (μ)",
    ),
    MapRow(
        "ppo.ppo_n_minibatches",
        "steps_per_generation",
        "approx",
        "optimizer steps per generation batch, per_device_train_batch_size = batch / n; TRL "
        "splits a shuffled batch into equal row counts, the harness into token-balanced bins; "
        "prompts_per_step × n_samples must divide by it",
    ),
    MapRow(
        "ppo.kl_ctl",
        "beta",
        "must",
        "0 only: the harness puts the KL to the reference into the reward (before the advantage), "
        "TRL's beta adds a k3 KL term to the loss — a different objective",
    ),
    MapRow("ppo.kl_estimator", "-", "approx", "only used with kl_ctl > 0 (which is an error here)"),
    MapRow(
        "ppo.entropy_coef",
        "entropy_coef",
        "approx",
        "loss − coef·H; TRL's H is the mean over each micro-batch's tokens",
    ),
    MapRow("ppo.temperature", "temperature", "exact", "sampling and training log-probs"),
    MapRow(
        "ppo.reward_scaling / reward_bias / reward_clip",
        "(reward function)",
        "exact",
        "applied inside the reward function the trainer hands TRL: clip((R+bias)·scaling)",
    ),
    MapRow(
        "ppo.discount / ppo.gae_lambda",
        "-",
        "must",
        "1.0 only: without a critic TRL gives every token the sequence advantage",
    ),
    MapRow("critic.enabled", "-", "none", "GRPOTrainer has no value model / GAE"),
    MapRow(
        "rollout.staleness", "-", "none", "GRPOTrainer samples with the current policy (no lag)"
    ),
    MapRow(
        "ppo.use_decoupled_loss",
        "-",
        "none",
        "a proximal policy separate from the sampler exists in TRL only with vLLM",
    ),
    MapRow(
        "ppo.prox_logp_method",
        "-",
        "none",
        "TRL recomputes π_prox with a forward pass (no interpolation option)",
    ),
    MapRow(
        "ppo.behave_imp_weight_mode / rejection_sampling",
        "vllm_importance_sampling_mode",
        "none",
        "the legacy behaviour-weight fields; use ppo.correction (below)",
    ),
    MapRow(
        "ppo.correction",
        "off_policy_mask_threshold / vllm_importance_sampling_*",
        "exact",
        "preset opsm (DeepSeek-V3.2's mask) → off_policy_mask_threshold; an IS weight → "
        "vllm_importance_sampling_{correction,mode,clip_min,clip_max}, which TRL applies only "
        "with its vLLM sampler, so only with rollout.sampler_backend: vllm (refused otherwise); "
        "no weight → vllm_importance_sampling_correction = false (TRL's default would apply "
        "sequence_mask)",
    ),
    MapRow(
        "ppo.recompute_logprob",
        "-",
        "approx",
        "TRL always uses the training forward's log-probs as the old policy (recompute = true)",
    ),
    MapRow(
        "rollout.n_samples",
        "num_generations",
        "must",
        "the group; TRL needs >= 2",
    ),
    MapRow(
        "rollout.prompts_per_step",
        "generation_batch_size",
        "exact",
        "generation_batch_size = prompts_per_step × n_samples; prompts in the harness's order",
    ),
    MapRow("rollout.max_new_tokens", "max_completion_length", "exact", "longest completion"),
    MapRow("rollout.top_p", "top_p", "exact", "nucleus threshold; top_k = 0 (off) as the harness"),
    MapRow("optim.lr", "learning_rate", "exact", "AdamW learning rate"),
    MapRow("optim.beta1 / beta2", "adam_beta1 / adam_beta2", "exact", "AdamW betas"),
    MapRow(
        "optim.weight_decay",
        "weight_decay",
        "approx",
        "AdamW weight decay; HF exempts biases and norm weights, the harness decays all",
    ),
    MapRow(
        "optim.schedule",
        "lr_scheduler_type",
        "exact",
        "constant → constant_with_warmup, linear → linear, cosine → cosine",
    ),
    MapRow(
        "optim.warmup_steps",
        "warmup_steps",
        "approx",
        "in optimizer steps; HF's ramp starts at 0, the harness's at 1/warmup",
    ),
    MapRow("optim.grad_clip", "max_grad_norm", "exact", "null → 0 (no clipping)"),
    MapRow(
        "seed", "seed", "approx", "same model init, prompts and warm start; TRL's own sampler RNG"
    ),
    MapRow("steps", "max_steps", "exact", "max_steps = steps × ppo_n_minibatches × ppo_epochs"),
    MapRow(
        "model_options.dtype (bf16)",
        "bf16",
        "approx",
        "bfloat16 autocast with float32 master weights (pass-through); HF autocasts TRL's "
        "training forward, the harness also its sampler",
    ),
    MapRow(
        "model_options.gradient_checkpointing",
        "gradient_checkpointing",
        "exact",
        "pass-through (applied before the warm start, as the harness loop does)",
    ),
    MapRow(
        "model_options.lora",
        "(peft model)",
        "exact",
        "the harness wraps the model with the same peft LoRA before the warm start; TRL trains "
        "the adapters it is handed (no peft_config needed)",
    ),
    MapRow(
        "rollout.sampler_backend",
        "use_vllm / vllm_mode",
        "must",
        "auto → use_vllm = false (TRL decodes with model.generate); vllm → use_vllm = true, "
        "vllm_mode = colocate (TRL's own engine in the trainer's process, docs/engine.md); "
        "fast / hf are the harness's decoders: refused",
    ),
    MapRow("rollout.max_prompt_tokens", "-", "none", "TRL 1.16 has no prompt truncation; use null"),
    MapRow("rollout.chat_template", "-", "must", "none (plain-text prompts) only"),
    MapRow(
        "rollout.sampler_dtype",
        "(engine dtype)",
        "must",
        "with sampler_backend vllm: the dtype of the engine TRL builds (the trainer passes it: "
        "TRL passes none, and vLLM's auto would run a float32 checkpoint in bfloat16); "
        "otherwise null or model_options.dtype (TRL samples with the learner)",
    ),
    MapRow("rollout.sampler_logit_noise", "-", "must", "0 only (no sampler noise in TRL)"),
    MapRow(
        "rollout.measure_mismatch",
        "-",
        "none",
        "ignored: without vLLM TRL's sampler is the learner, so no mismatch/* are logged; with "
        "it TRL logs mismatch/logprob_abs_diff_{mean,max} only when an IS weight is set",
    ),
    MapRow(
        "rollout.engine_gpu_memory_utilization",
        "vllm_gpu_memory_utilization",
        "exact",
        "CUDA: the engine's share of the GPU (sampler_backend vllm)",
    ),
    MapRow(
        "rollout.engine_kv_cache_gib",
        "-",
        "exact",
        "CPU: the engine's KV cache (VLLM_CPU_KVCACHE_SPACE, set by the trainer)",
    ),
    MapRow("device", "use_cpu", "exact", "cpu → use_cpu = true; cuda → the accelerator's device"),
)


def markdown() -> str:
    lines = [
        f"| harness option | TRL {TRL_VERSION} `GRPOConfig` | fidelity | how |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{m.harness}` | `{m.trl}` | {m.kind} | {m.note} |" for m in TRL_MAPPING]
    return "\n".join(lines) + "\n"

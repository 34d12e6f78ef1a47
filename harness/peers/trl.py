"""How a harness ``RunConfig`` becomes TRL 1.16 ``GRPOConfig`` arguments — the mapping as data.

``TRL_MAPPING`` is the table of ``docs/trl.md`` (``python -m harness.peers.trl`` writes it):
one row per harness option with the ``GRPOConfig`` field it becomes and how faithful that is:

    exact      same math (up to float rounding)
    approx     same intent, a documented difference (named in the run's ``trl.approximations`` tag)
    must       only some values are expressible; any other value is a one-line error
    none       TRL cannot express the option; any non-default value is a one-line error

``trl_problems(cfg)`` lists every (field, reason) TRL cannot express; ``grpo_kwargs(cfg)`` returns
the algorithm's ``GRPOConfig`` keyword arguments (the trainer adds the runtime ones: output dir,
device, logging).  This module never imports TRL (nor the config layer), so the config layer can validate with
it.
Source read: ``trl/trainer/grpo_trainer.py`` (``_compute_loss``, ``_generate_and_score_completions``)
and ``grpo_config.py`` at TRL 1.16.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from harness.peers.corrections import trl_settings
from harness.ppo.objectives import OBJECTIVES, lookup

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
        how += [f"{o.name}.{ours} must be {_shown(v)}" for ours, (v, _) in peer.fixed.items()]
        parts.append(f"{o.name} → {peer.name}" + (f" ({', '.join(how)})" if how else ""))
    if missing:
        parts.append(f"{', '.join(missing)} have no TRL loss_type")
    return "; ".join(parts)


def _shown(value: Any) -> str:
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


# TRL's fixed group/batch std epsilon (``advantages / (std_rewards + 1e-4)``).
TRL_STD_EPS = 1e-4


def _model_opt(cfg: Any, name: str, default: Any) -> Any:
    return getattr(getattr(cfg, "model_options", None), name, default)


def _policy_loss(cfg: Any) -> str:
    return str(getattr(cfg.ppo, "policy_loss", "ppo"))


def _objective_problems(cfg: Any) -> list[tuple[str, str]]:
    """What TRL cannot say about the objective, from its declaration (at most one problem)."""
    p, pl = cfg.ppo, _policy_loss(cfg)
    o = lookup(pl)
    peer = o.trl
    if peer is None:
        have = ", ".join(x.name for x in OBJECTIVES.values() if x.trl is not None)
        return [("ppo.policy_loss", f"TRL has no loss_type for {pl!r} ({have})")]
    options = getattr(p, pl, None)
    for ours, (value, why) in peer.fixed.items():
        if getattr(options, ours) != value:
            return [(f"ppo.{pl}.{ours}", f"{why}; use {_shown(value)}")]
    if peer.aggregations and p.loss_agg_mode not in peer.aggregations:
        only = " / ".join(peer.aggregations)
        return [("ppo.loss_agg_mode", f"TRL's {peer.name} loss is {only} only")]
    return []


VLLM_ONLY = (
    "TRL applies vllm_importance_sampling_* only with its vLLM sampler: set "
    "rollout.sampler_backend: vllm"
)


def _uses_engine(cfg: Any) -> bool:
    return getattr(cfg.rollout, "sampler_backend", "auto") == "vllm"


def _correction_problems(p: Any, engine: bool) -> list[tuple[str, str]]:
    """What TRL cannot say about ``ppo.correction`` (its IS weights only exist with vLLM)."""
    c = getattr(p, "correction", None)
    if c is None:
        return []
    kw, problems = trl_settings(c)
    if any(k.startswith("vllm_") for k in kw):
        if not engine:
            problems.append(("ppo.correction.weight", VLLM_ONLY))
        if getattr(p, "policy_loss", "ppo") == "vespo":
            problems += _vespo_composition_problems(p, kw)
    return problems


def _vespo_composition_problems(p: Any, kw: dict[str, Any]) -> list[tuple[str, str]]:
    """TRL's VESPO folds its vLLM weight ρ into W and refuses sequence-level ρ."""
    out = []
    if not str(kw["vllm_importance_sampling_mode"]).startswith("token"):
        out.append(
            (
                "ppo.correction.weight",
                "TRL's VESPO takes only token_truncate / token_mask weights (folded into W)",
            )
        )
    if p.vespo.behaviour_weight != "fold":
        out.append(
            (
                "ppo.vespo.behaviour_weight",
                "TRL's VESPO folds ρ into W (log W += Σ_t clamp(log ρ_t, log 1e-8, 20)) and does "
                "not multiply the loss by ρ; this cell multiplies (W against π_prox only). Set "
                "fold for TRL's composition",
            )
        )
    return out


def _algorithm_problems(cfg: Any) -> list[tuple[str, str]]:
    """The critic, a lagged or proximal policy, behaviour weights and the correction."""
    p, r = cfg.ppo, cfg.rollout
    out: list[tuple[str, str]] = []
    if cfg.critic.enabled:
        out.append(("critic.enabled", "GRPOTrainer has no value model (critic/GAE)"))
    if r.staleness:
        out.append(("rollout.staleness", "GRPOTrainer always samples with the current policy"))
    if p.use_decoupled_loss:
        out.append(("ppo.use_decoupled_loss", "TRL has a separate proximal policy only with vLLM"))
    if p.prox_logp_method != "recompute":
        out.append(
            (
                "ppo.prox_logp_method",
                "TRL recomputes π_prox with a forward pass; it has no interpolation option",
            )
        )
    if p.behave_imp_weight_mode != "disabled" or p.rejection_sampling is not None:
        field = "behave_imp_weight_mode" if p.rejection_sampling is None else "rejection_sampling"
        out.append((f"ppo.{field}", "behaviour weights need a separate vLLM sampler in TRL"))
    out += _correction_problems(p, _uses_engine(cfg))
    return out


def _normalization_problems(cfg: Any) -> list[tuple[str, str]]:
    """Advantage and reward normalization TRL's scale_rewards cannot express."""
    p = cfg.ppo
    out: list[tuple[str, str]] = []
    if p.adv_norm is not None:
        out.append(("ppo.adv_norm", "TRL has no token-level advantage normalization; set null"))
    n = p.reward_norm
    if n is None or n.mean_level != "group":
        out.append(
            (
                "ppo.reward_norm",
                "TRL always centres rewards by the group mean; use mean_level: group",
            )
        )
    elif n.divide_by == "mean":
        out.append(
            (
                "ppo.reward_norm.divide_by",
                "TRL 1.16's GRPOTrainer has no mean-divided (MaxRL) advantage; scale_rewards "
                "divides by a std or not at all",
            )
        )
    elif n.mean_leave1out:
        out.append(("ppo.reward_norm.mean_leave1out", "TRL has no leave-one-out mean"))
    elif n.std_level is not None and not n.std_unbiased:
        out.append(("ppo.reward_norm.std_unbiased", "TRL's std is always Bessel-corrected"))
    return out


def _loss_problems(cfg: Any) -> list[tuple[str, str]]:
    """The KL, the return, the clip, the loss aggregation, truncation, filtering and the objective."""
    p, r = cfg.ppo, cfg.rollout
    out: list[tuple[str, str]] = []
    if p.kl_ctl > 0:
        out.append(
            (
                "ppo.kl_ctl",
                "the harness's KL is in the reward, TRL's beta is a k3 KL in the loss; use 0",
            )
        )
    if p.discount != 1.0 or p.gae_lambda != 1.0:
        which = "ppo.discount" if p.discount != 1.0 else "ppo.gae_lambda"
        out.append((which, "without a critic TRL gives every token the sequence advantage; use 1"))
    if p.c_clip is not None:
        hi = p.eps_clip if p.eps_clip_higher is None else p.eps_clip_higher
        if not p.c_clip > 1 + hi:
            out.append(
                (
                    "ppo.c_clip",
                    f"TRL's delta equals the dual clip only when > 1 + eps_clip_higher ({1 + hi:g})",
                )
            )
    if p.loss_agg_mode == "prompt-mean":
        out.append(("ppo.loss_agg_mode", "TRL has no prompt-level loss_type (prompt-mean)"))
    if p.truncated_completions == "zero_reward":
        out.append(
            (
                "ppo.truncated_completions",
                "TRL can drop truncated completions (mask) but not zero their reward",
            )
        )
    if r.zero_variance_filter:
        out.append(("rollout.zero_variance_filter", "GRPOTrainer has no zero-variance filter"))
    out += _objective_problems(cfg)
    return out


def _rollout_problems(cfg: Any) -> list[tuple[str, str]]:
    """Prompts, the chat template, the sampler and the batch shape."""
    p, r = cfg.ppo, cfg.rollout
    engine = _uses_engine(cfg)
    out: list[tuple[str, str]] = []
    if getattr(r, "max_prompt_tokens", None) is not None:
        out.append(
            ("rollout.max_prompt_tokens", "TRL 1.16's GRPOTrainer does not truncate prompts")
        )
    template = getattr(r, "chat_template", "none")
    if template != "none":
        # The trainer hands TRL the task's prompt strings, and TRL renders a chat template only
        # for conversational (message-list) prompts: `auto` or a template file would silently
        # not be applied, so it is refused with the other inexpressible options.
        what = "auto" if template == "auto" else "a template file"
        out.append(
            (
                "rollout.chat_template",
                f"the trainer feeds TRL the task's prompts as plain text, so {what} cannot be "
                "applied; use none",
            )
        )
    dtype = getattr(r, "sampler_dtype", None)
    if dtype is not None and dtype != _model_opt(cfg, "dtype", "float32") and not engine:
        out.append(
            (
                "rollout.sampler_dtype",
                "TRL samples with the learner, at its precision; use null (or "
                "rollout.sampler_backend: vllm for an engine in another dtype)",
            )
        )
    if getattr(r, "sampler_logit_noise", 0.0) > 0:
        out.append(("rollout.sampler_logit_noise", "TRL has no sampler noise; use 0"))
    if getattr(r, "sampler_backend", "auto") not in ("auto", "vllm"):
        out.append(
            (
                "rollout.sampler_backend",
                "TRL decodes with model.generate (auto) or its own vLLM engine (vllm); "
                "fast and hf are the harness's decoders",
            )
        )
    if r.n_samples < 2:
        out.append(("rollout.n_samples", "TRL's GRPOTrainer needs at least 2 samples per prompt"))
    batch = r.prompts_per_step * r.n_samples
    if batch % p.ppo_n_minibatches:
        out.append(
            (
                "ppo.ppo_n_minibatches",
                f"must divide prompts_per_step × n_samples ({batch}) for TRL's equal minibatches",
            )
        )
    return out


def trl_problems(cfg: Any) -> list[tuple[str, str]]:
    """Every option of ``cfg`` that TRL's GRPOTrainer cannot express, as (field, reason)."""
    return [
        *_algorithm_problems(cfg),
        *_normalization_problems(cfg),
        *_loss_problems(cfg),
        *_rollout_problems(cfg),
    ]


def approximations(cfg: Any) -> list[str]:
    """The documented differences a TRL run of ``cfg`` has from the harness's own loop."""
    p = cfg.ppo
    out = []
    if p.ppo_n_minibatches > 1:
        out.append("minibatches: equal rows of a shuffled batch (harness: token-balanced bins)")
    n = p.reward_norm
    if n is not None and n.std_level == "batch":
        out.append("batch std about the batch mean (harness: pooled about the group means)")
    if n is not None and n.std_level is not None and not math.isclose(n.eps, TRL_STD_EPS):
        out.append(f"std eps {TRL_STD_EPS:g} (harness: {n.eps:g})")
    if p.loss_agg_mode == "seq-mean-token-sum-norm":
        out.append("dr_grpo divides by max_completion_length (harness: padded minibatch width)")
    if p.entropy_coef:
        out.append("entropy bonus averaged per micro-batch")
    if cfg.optim.weight_decay:
        out.append("weight decay skips biases and norm weights (HF)")
    return out


_LOSS_TYPE = {
    "token-mean": "bnpo",
    "seq-mean-token-mean": "grpo",
    "seq-mean-token-sum": "luspo",
    "seq-mean-token-sum-norm": "dr_grpo",
}
_SCHEDULE = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def grpo_kwargs(cfg: Any, *, strict: bool = True) -> dict[str, Any]:
    """The algorithm's ``GRPOConfig`` keyword arguments for ``cfg``.  ``strict``: raise
    ``ValueError`` naming the first inexpressible option; otherwise leave out what TRL cannot say
    (``harness export`` names it in a comment)."""
    problems = trl_problems(cfg)
    if problems and strict:
        field, reason = problems[0]
        raise ValueError(f"{field}: not expressible with trainer: trl ({reason})")
    p, r, o = cfg.ppo, cfg.rollout, cfg.optim
    batch = r.prompts_per_step * r.n_samples
    pl = _policy_loss(cfg)
    trl_peer = lookup(pl).trl
    loss_type = (
        trl_peer.name
        if trl_peer is not None and trl_peer.name
        else _LOSS_TYPE.get(p.loss_agg_mode, "")
    )
    bad = {field.split(".")[1] if "." in field else field for field, _ in problems}
    kw: dict[str, Any] = {
        "epsilon": p.eps_clip,
        "epsilon_high": p.eps_clip if p.eps_clip_higher is None else p.eps_clip_higher,
        "importance_sampling_level": p.importance_sampling_level,
        "loss_type": loss_type,
        "num_iterations": p.ppo_epochs,
        "steps_per_generation": p.ppo_n_minibatches,
        "per_device_train_batch_size": batch // p.ppo_n_minibatches,
        "gradient_accumulation_steps": 1,
        "beta": 0.0,
        "entropy_coef": p.entropy_coef,
        "temperature": p.temperature,
        "num_generations": r.n_samples,
        "max_completion_length": r.max_new_tokens,
        "top_p": r.top_p,
        "top_k": 0,
        "learning_rate": o.lr,
        "adam_beta1": o.beta1,
        "adam_beta2": o.beta2,
        "weight_decay": o.weight_decay,
        "lr_scheduler_type": _SCHEDULE[o.schedule],
        "warmup_steps": o.warmup_steps,
        "max_grad_norm": o.grad_clip if o.grad_clip is not None else 0.0,
        "max_steps": cfg.steps * p.ppo_n_minibatches * p.ppo_epochs,
        "seed": cfg.seed,
        # GPU-side options the harness config has (pass-throughs): bf16 autocast with float32
        # master weights is HF's bf16=True; gradient checkpointing is applied to the model
        # before the warm start (as in the harness loop) and named here for TRL's own setup.
        "bf16": _model_opt(cfg, "dtype", "float32") == "bfloat16",
        "gradient_checkpointing": bool(_model_opt(cfg, "gradient_checkpointing", False)),
    }
    norm = p.reward_norm
    if norm is not None and "reward_norm" not in bad:
        kw["scale_rewards"] = {"group": "group", "batch": "batch", None: "none"}[norm.std_level]
    if p.c_clip is not None and "c_clip" not in bad:
        kw["delta"] = p.c_clip
    if "policy_loss" in bad or not loss_type:
        del kw["loss_type"]
    # The stability options TRL has, named only when set (TRL's defaults are the harness's).
    if p.top_entropy_quantile < 1.0:
        kw["top_entropy_quantile"] = p.top_entropy_quantile
    if p.truncated_completions == "mask":
        kw["mask_truncated_completions"] = True
    if "ppo_n_minibatches" in bad:  # uneven split: one optimizer step per generation batch
        kw["steps_per_generation"], kw["per_device_train_batch_size"] = 1, batch
    if getattr(p, "correction", None) is not None:
        # The correction under TRL's names (the vLLM weights act only with TRL's engine: without
        # it they are refused above, and reach only an exported config).
        kw.update(trl_settings(p.correction)[0])
    if _uses_engine(cfg):
        kw["use_vllm"] = True
        kw["vllm_mode"] = "colocate"
        kw["vllm_gpu_memory_utilization"] = r.engine_gpu_memory_utilization
        # TRL's default is a sequence_mask correction; the harness applies one only when
        # ppo.correction names a weight.
        kw.setdefault("vllm_importance_sampling_correction", False)
    peer = lookup(pl).trl
    if peer is not None and peer.options:
        # The objective's own options under TRL's names (cispo's cap is TRL's epsilon_high).
        options = getattr(p, pl)
        for ours, theirs in peer.options.items():
            kw[theirs] = getattr(options, ours)
    return kw


def markdown() -> str:
    lines = [
        f"| harness option | TRL {TRL_VERSION} `GRPOConfig` | fidelity | how |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{m.harness}` | `{m.trl}` | {m.kind} | {m.note} |" for m in TRL_MAPPING]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")

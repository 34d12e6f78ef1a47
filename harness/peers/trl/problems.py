"""What TRL 1.16's ``GRPOTrainer`` cannot express of a config (``trl_problems``), and the
documented differences of what it can (``approximations``)."""

from __future__ import annotations

import math
from typing import Any

from harness.config.schema import RunConfig
from harness.peers.corrections import trl_settings
from harness.peers.trl.mapping import shown
from harness.ppo.config import PPOActorConfig
from harness.ppo.objectives import OBJECTIVES, lookup
from harness.ppo.objectives.registry import options_of

# TRL's fixed group/batch std epsilon (``advantages / (std_rewards + 1e-4)``).
TRL_STD_EPS = 1e-4


def model_opt(cfg: RunConfig, name: str, default: Any) -> Any:
    """``cfg.model_options.<name>``, or ``default`` where the config has none."""
    return getattr(getattr(cfg, "model_options", None), name, default)


def policy_loss_of(cfg: RunConfig) -> str:
    """The name of ``cfg``'s objective (``ppo.policy_loss``)."""
    return str(getattr(cfg.ppo, "policy_loss", "ppo"))


def _objective_problems(cfg: RunConfig) -> list[tuple[str, str]]:
    """What TRL cannot say about the objective, from its declaration (at most one problem)."""
    p, pl = cfg.ppo, policy_loss_of(cfg)
    o = lookup(pl)
    peer = o.trl
    if peer is None:
        have = ", ".join(x.name for x in OBJECTIVES.values() if x.trl is not None)
        return [("ppo.policy_loss", f"TRL has no loss_type for {pl!r} ({have})")]
    options = getattr(p, pl, None)
    for ours, (value, why) in peer.fixed.items():
        if getattr(options, ours) != value:
            return [(f"ppo.{pl}.{ours}", f"{why}; use {shown(value)}")]
    if peer.aggregations and p.loss_agg_mode not in peer.aggregations:
        only = " / ".join(peer.aggregations)
        return [("ppo.loss_agg_mode", f"TRL's {peer.name} loss is {only} only")]
    return []


VLLM_ONLY = (
    "TRL applies vllm_importance_sampling_* only with its vLLM sampler: set "
    "rollout.sampler_backend: vllm"
)


def uses_engine(cfg: RunConfig) -> bool:
    """Whether ``cfg`` samples with TRL's colocated vLLM engine."""
    return getattr(cfg.rollout, "sampler_backend", "auto") == "vllm"


def _correction_problems(p: PPOActorConfig, engine: bool) -> list[tuple[str, str]]:
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


def _vespo_composition_problems(p: PPOActorConfig, kw: dict[str, Any]) -> list[tuple[str, str]]:
    """TRL's VESPO folds its vLLM weight ρ into W and refuses sequence-level ρ."""
    out = []
    if not str(kw["vllm_importance_sampling_mode"]).startswith("token"):
        out.append(
            (
                "ppo.correction.weight",
                "TRL's VESPO takes only token_truncate / token_mask weights (folded into W)",
            )
        )
    if options_of(p, "vespo").behaviour_weight != "fold":
        out.append(
            (
                "ppo.vespo.behaviour_weight",
                "TRL's VESPO folds ρ into W (log W += Σ_t clamp(log ρ_t, log 1e-8, 20)) and does "
                "not multiply the loss by ρ; this cell multiplies (W against π_prox only). Set "
                "fold for TRL's composition",
            )
        )
    return out


def _algorithm_problems(cfg: RunConfig) -> list[tuple[str, str]]:
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
    out += _correction_problems(p, uses_engine(cfg))
    return out


def _normalization_problems(cfg: RunConfig) -> list[tuple[str, str]]:
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


def _loss_problems(cfg: RunConfig) -> list[tuple[str, str]]:
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


def _rollout_problems(cfg: RunConfig) -> list[tuple[str, str]]:
    """Prompts, the chat template, the sampler and the batch shape."""
    p, r = cfg.ppo, cfg.rollout
    engine = uses_engine(cfg)
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
    if dtype is not None and dtype != model_opt(cfg, "dtype", "float32") and not engine:
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


def trl_problems(cfg: RunConfig) -> list[tuple[str, str]]:
    """Every option of ``cfg`` that TRL's GRPOTrainer cannot express, as (field, reason)."""
    return [
        *_algorithm_problems(cfg),
        *_normalization_problems(cfg),
        *_loss_problems(cfg),
        *_rollout_problems(cfg),
    ]


def approximations(cfg: RunConfig) -> list[str]:
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

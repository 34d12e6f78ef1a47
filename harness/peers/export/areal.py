"""The AReaL target: YAML under AReaL's keys (``actor.eps_clip``, ``actor.adv_norm.mean_level``,
...), every value through ``yaml.safe_dump``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from harness.core.configtools import ConfigError, to_dict
from harness.peers.export.asynchrony import areal_async
from harness.peers.export.common import comment, sampler_notes, warm_start_note
from harness.ppo.corrections import legacy_to_rejection_sampling
from harness.ppo.objectives import lookup

if TYPE_CHECKING:
    from harness.config import RunConfig


def _areal_norm(n: Any, name: str, n_samples: int, notes: list[str]) -> Any:
    """A harness NormConfig as AReaL's: its group size is the cell's n_samples (AReaL's own field
    defaults to 1: groups of one sample, i.e. no group normalization at all)."""
    d = to_dict(n)
    if isinstance(d, dict):
        d["group_size"] = n_samples
        # AReaL's NormConfig always divides by a std (or nothing): MaxRL's mean divisor is
        # named in a comment, not written as a key AReaL would refuse.
        if d.pop("divide_by", "std") == "mean":
            notes.append(
                f"# ppo.{name}.divide_by=mean: AReaL's NormConfig has no mean divisor "
                "(MaxRL); written without it, i.e. centred and not divided"
            )
    return d


def _areal_actor(cfg: RunConfig) -> tuple[dict[str, Any], list[str]]:
    """AReaL's ``actor:`` block for the settings it shares with the harness, LoRA included."""
    p, r, o, m = cfg.ppo, cfg.rollout, cfg.optim, cfg.model_options
    notes: list[str] = []

    def norm(n: Any, name: str) -> Any:
        return _areal_norm(n, name, r.n_samples, notes)

    actor: dict[str, Any] = {
        "group_size": r.n_samples,
        "eps_clip": p.eps_clip,
        "eps_clip_higher": p.eps_clip_higher,
        "c_clip": p.c_clip,
        "use_decoupled_loss": p.use_decoupled_loss,
        "recompute_logprob": p.recompute_logprob,
        "prox_logp_method": p.prox_logp_method,
        "importance_sampling_level": p.importance_sampling_level,
        "ppo_n_minibatches": p.ppo_n_minibatches,
        "adv_norm": norm(p.adv_norm, "adv_norm"),
        "reward_norm": norm(p.reward_norm, "reward_norm"),
        "kl_ctl": p.kl_ctl,
        "kl_estimator": p.kl_estimator,
        "discount": p.discount,
        "gae_lambda": p.gae_lambda,
        "reward_scaling": p.reward_scaling,
        "reward_bias": p.reward_bias,
        "reward_clip": p.reward_clip,
        "temperature": p.temperature,
        "dtype": m.dtype,
        "gradient_checkpointing": m.gradient_checkpointing,
        "optimizer": {
            "lr": o.lr,
            "weight_decay": o.weight_decay,
            "beta1": o.beta1,
            "beta2": o.beta2,
            "gradient_clipping": o.grad_clip if o.grad_clip is not None else 1e9,
            "lr_scheduler_type": o.schedule,
        },
    }
    if m.lora is not None:
        for name in m.lora.target_modules:
            if "${" in name:  # AReaL reads its YAML through OmegaConf, which would interpolate
                raise ConfigError(
                    f"model_options.lora.target_modules: {name!r} cannot be exported to AReaL "
                    "(OmegaConf would resolve '${...}' in it)"
                )
        actor.update(
            use_lora=True,
            lora_rank=m.lora.r,
            lora_alpha=m.lora.alpha,
            target_modules=list(m.lora.target_modules),
        )
        if m.lora.dropout:
            notes.append(
                f"# model_options.lora.dropout={m.lora.dropout}: AReaL's LoRA has no dropout option"
            )
    return actor, notes


def _areal_rest(cfg: RunConfig, actor: dict[str, Any]) -> list[str]:
    """What AReaL spells differently or lacks: precision, the sampler, corrections and
    rejection sampling, warmup, epochs, aggregation, the objective, entropy, stability, critic
    (the actor options it does have are added to ``actor``)."""
    p, o, m = cfg.ppo, cfg.optim, cfg.model_options
    notes: list[str] = []
    if m.dtype == "bfloat16":
        notes.append(
            "# model_options.dtype=bfloat16: approximate; AReaL's actor.dtype is the parameter "
            "dtype, the harness keeps float32 master weights under bf16 autocast"
        )
    notes += sampler_notes(cfg, "AReaL", None)
    notes += warm_start_note(cfg, "AReaL")
    if p.correction is not None:
        notes.append(
            "# ppo.correction: AReaL's actor has rejection_sampling only (the harness's "
            "ppo.rejection_sampling is that setting); not mapped"
        )
    rs, rs_notes = _areal_rejection_sampling(p)
    if rs is not None:
        actor["rejection_sampling"] = rs
    notes += rs_notes
    if o.warmup_steps:
        notes.append(
            f"# optim.warmup_steps={o.warmup_steps}: AReaL takes a proportion "
            "(optimizer.warmup_steps_proportion) of the total steps"
        )
    else:  # AReaL's default proportion is 0.001, not none
        actor["optimizer"]["warmup_steps_proportion"] = 0.0
    if p.ppo_epochs != 1:
        notes.append(f"# ppo.ppo_epochs={p.ppo_epochs}: AReaL's actor makes one pass per batch")
    if p.loss_agg_mode != "token-mean":
        notes.append(f"# ppo.loss_agg_mode={p.loss_agg_mode}: AReaL's loss is the token mean")
    areal = lookup(p.policy_loss).areal
    if areal is None:
        notes.append(f"# ppo.policy_loss={p.policy_loss}: AReaL's actor loss is PPO-clip")
    else:  # an objective AReaL spells as actor options (M2PO's actor.m2_threshold)
        own = getattr(p, p.policy_loss, None)
        for ours, theirs in (areal.options or {}).items():
            actor[theirs] = getattr(own, ours)
        if areal.note:
            notes.append(f"# ppo.policy_loss={p.policy_loss}: {areal.note}")
    if p.entropy_coef:
        notes.append("# ppo.entropy_coef: AReaL's actor has no entropy bonus")
    notes += _areal_stability(cfg, actor)
    if cfg.critic.enabled:
        notes.append("# critic.*: AReaL configures a critic as its own `critic:` engine block")
    return notes


def export_areal(cfg: RunConfig) -> str:
    r, p = cfg.rollout, cfg.ppo
    actor, notes = _areal_actor(cfg)
    notes += _areal_rest(cfg, actor)
    rollout, async_notes = areal_async(cfg)
    notes += async_notes
    doc: dict[str, Any] = {
        "actor": actor,
        "gconfig": {
            "n_samples": r.n_samples,
            "max_new_tokens": r.max_new_tokens,
            "temperature": p.temperature,
            "top_p": r.top_p,
        },
        "train_dataset": {"batch_size": r.prompts_per_step},
        "rollout": rollout,
    }
    body = yaml.safe_dump(doc, sort_keys=False)
    lines = [comment(n.removeprefix("# ")) for n in notes]
    return "\n".join(lines) + ("\n" if lines else "") + body


# What AReaL main's RejectionSamplingConfig.__post_init__ accepts as metric (binary_kl, KPop,
# is implemented there but missing from this list, so a config naming it fails at load).
AREAL_RS_METRICS = ("ratio", "kl_k1", "kl_k2", "kl_k3")


def _areal_rejection_sampling(p: Any) -> tuple[dict[str, Any] | None, list[str]]:
    """``actor.rejection_sampling`` as AReaL main takes it.  AReaL main removed
    ``behave_imp_weight_mode`` / ``_cap``: a legacy mode is written as AReaL's own migration
    of it; a block AReaL would refuse is a comment, not a key."""
    if p.rejection_sampling is not None:
        rs = to_dict(p.rejection_sampling)
        if rs["metric"] not in AREAL_RS_METRICS:
            return None, [
                f"# ppo.rejection_sampling.metric={rs['metric']}: AReaL main refuses it "
                f"(RejectionSamplingConfig accepts metric {', '.join(AREAL_RS_METRICS)}); not "
                f"written: rejection_sampling: {rs}"
            ]
        return rs, []
    if p.behave_imp_weight_mode == "disabled":
        return None, []
    legacy = legacy_to_rejection_sampling(p.behave_imp_weight_mode, p.behave_imp_weight_cap)
    assert legacy is not None
    return to_dict(legacy), [
        f"# ppo.behave_imp_weight_mode={p.behave_imp_weight_mode} (cap "
        f"{p.behave_imp_weight_cap}): AReaL main removed behave_imp_weight_mode/_cap; written as "
        "the rejection_sampling AReaL migrates it to (the legacy mode kept dropped tokens in "
        "the loss mask with weight 0: only importance_sampling_level sequence can tell)"
    ]


def _areal_stability(cfg: RunConfig, actor: dict[str, Any]) -> list[str]:
    """AReaL's actor options for the stability options it has (into ``actor``); comments for
    the others."""
    p, r = cfg.ppo, cfg.rollout
    notes = []
    if p.overlong_reward_penalty:
        actor.update(
            overlong_reward_penalty=True,
            overlong_tokens=p.overlong_tokens,
            overlong_penalty_factor=p.overlong_penalty_factor,
        )
    if p.truncated_completions == "zero_reward":
        actor["mask_no_eos_with_zero"] = True
    elif p.truncated_completions == "mask":
        notes.append(
            "# ppo.truncated_completions=mask: AReaL cannot drop completions without EOS from the "
            "loss (its mask_no_eos_with_zero zeroes their reward: truncated_completions=zero_reward)"
        )
    if p.top_entropy_quantile < 1.0:
        notes.append(
            f"# ppo.top_entropy_quantile={p.top_entropy_quantile}: AReaL's actor has no "
            "top-entropy token mask"
        )
    if r.zero_variance_filter:
        notes.append(
            "# rollout.zero_variance_filter: AReaL has no config key for dropping "
            "zero-variance groups"
        )
    return notes

"""The verl target: Hydra overrides (``actor_rollout_ref.actor.clip_ratio_low=...``), one per
line, shell-quoted where the shell would otherwise read them; strings are refused unless they are
plain module names (Hydra would interpolate ``${...}`` inside quotes: the syntax is
:mod:`harness.peers.export.hydra`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.core.configtools import to_dict
from harness.peers.corrections import verl_settings
from harness.peers.export.asynchrony import verl_async
from harness.peers.export.common import comment, lora_targets, sampler_notes, warm_start_note
from harness.peers.export.hydra import VERL_NAME, Quoted, override
from harness.ppo.corrections import resolve
from harness.ppo.objectives import lookup

if TYPE_CHECKING:
    from harness.config import RunConfig

# The verl release the overrides are written for: keys and loss semantics move between releases
# (0.9.1's gspo follows loss_agg_mode; up to 0.9.0 it forced seq-mean-token-mean).
VERL_VERSION = "0.9.1"

_VERL_KL = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}


@dataclass
class _Section:
    """A part of the export: its overrides ``(key, value)`` and its comments, each in the order
    they are written."""

    kv: list[tuple[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __iadd__(self, other: _Section) -> _Section:
        self.kv += other.kv
        self.notes += other.notes
        return self


def _verl_estimator(cfg: RunConfig) -> tuple[str | None, list[str], list[str]]:
    """(adv_estimator, extra overrides, comments) for the harness's advantage recipe."""
    p = cfg.ppo
    n, a = p.reward_norm, p.adv_norm
    if cfg.critic.enabled:
        notes = []
        if a is None or a.mean_level != "batch" or a.std_level != "batch":
            notes.append("# ppo.adv_norm: verl's gae always whitens advantages over the batch")
        return "gae", [], notes
    if n is not None and n.divide_by == "mean":
        # verl's own adv_estimator list has no mean-divided estimator (MaxRL's authors ship it
        # in their verl fork as adv_estimator=maxrl, with epsilon 1e-6).
        return (
            None,
            [],
            [
                "# ppo.reward_norm.divide_by=mean: verl has no MaxRL adv_estimator (the MaxRL "
                "authors' verl fork calls it maxrl: (r − μ)/(μ + 1e-6))"
            ],
        )
    if n is not None and n.mean_level == "group" and n.mean_leave1out and n.std_level is None:
        return "rloo", [], []
    if n is not None and n.mean_level == "group" and not n.mean_leave1out:
        notes = []
        if a is not None:
            notes.append(
                "# ppo.adv_norm: verl's grpo estimator has no further token-level "
                "advantage normalization"
            )
        if n.std_level == "group":
            return "grpo", [], notes
        if n.std_level is None:
            return "grpo", ["algorithm.norm_adv_by_std_in_grpo=False"], notes
        return (
            "reinforce_plus_plus_baseline",
            [],
            [
                "# ppo.reward_norm: group mean then batch whitening (token-weighted) approximates "
                "group mean + batch std"
            ],
        )
    if n is None and a is not None and a.mean_level == "batch" and a.std_level == "batch":
        return "reinforce_plus_plus", [], []
    return None, [], [f"# ppo.reward_norm / adv_norm: no verl adv_estimator matches {to_dict(n)}"]


def _verl_policy_loss(p: Any, A: str) -> _Section:
    """verl's ``policy_loss.loss_mode`` and the objective's options, from its declaration."""
    o = lookup(p.policy_loss)
    peer = o.verl
    c = resolve(p.correction)
    if o.name == "reinforce" and c is not None and c.bypass:
        # verl's bypass_mode loss replaces loss_mode; REINFORCE there is chosen by
        # algorithm.rollout_correction.loss_type (written with the correction).
        return _Section()
    if peer is None:
        return _Section(notes=[f"# ppo.policy_loss={o.name}: verl has no loss_mode for it"])
    options = getattr(p, o.name, None)
    mode = peer.name_for(p.importance_sampling_level, options)
    out = _Section([(f"{A}.policy_loss.loss_mode", mode)])
    if o.name == "dppo":
        out += _verl_dppo(p, A)
        return out
    if peer.options is None:
        why = (
            peer.note
            or "verl's names for them are not pinned here; check verl's policy_loss config"
        )
        if o.options is not None:
            out.notes.append(f"# ppo.{o.name} hyper-parameters: not exported ({why})")
        return out
    out.kv += [
        (f"{A}.policy_loss.{theirs}", getattr(options, ours))
        for ours, theirs in peer.options.items()
    ]
    return out


def _verl_dppo(p: Any, A: str) -> _Section:
    """verl's dppo_tv / dppo_kl read δ from actor.clip_ratio_low/high and truncate r at
    actor.clip_ratio_c: those keys carry DPPO's own values (they replace the PPO-clip ones)."""
    o = p.dppo
    lo, hi = o.deltas()
    out = _Section([(f"{A}.clip_ratio_low", lo), (f"{A}.clip_ratio_high", hi)])
    if o.surrogate == "truncated_is":
        out.kv.append((f"{A}.clip_ratio_c", o.cap()))
    else:
        out.kv.append((f"{A}.clip_ratio_c", 1e9))
        out.notes.append(
            "# ppo.dppo.surrogate=ratio: verl's dppo loss is −A·sg(min(r, clip_ratio_c))·log π; "
            "with clip_ratio_c=1e9 its gradient equals this cell's −A·r, its loss value does "
            "not (set ppo.dppo.surrogate truncated_is for verl's surrogate)"
        )
    if o.kl_tau:
        out.notes.append(
            f"# ppo.dppo.kl_tau={o.kl_tau}: verl's dppo loss has no drift term "
            "kl_tau·(ℓθ − ℓμ)² (prime-rl's default loss); not exported"
        )
    if o.anchor == "behaviour" and p.use_decoupled_loss:
        out.notes.append(
            "# ppo.dppo.anchor=behaviour: verl anchors DPPO at old_log_prob (π_prox under the "
            "decoupled loss); set ppo.dppo.anchor proximal for verl's"
        )
    return out


def _verl_stability(cfg: RunConfig) -> _Section:
    """The stability options in verl's DAPO recipe (``recipe.dapo.main_dapo``: its reward
    manager and ``algorithm.filter_groups``); what verl has no key for is a comment."""
    p, r = cfg.ppo, cfg.rollout
    out = _Section()
    if p.top_entropy_quantile < 1.0:
        out.notes.append(
            f"# ppo.top_entropy_quantile={p.top_entropy_quantile}: verl's actor has no "
            "top-entropy token mask"
        )
    if p.truncated_completions != "keep":
        out.notes.append(
            f"# ppo.truncated_completions={p.truncated_completions}: verl's actor has no option "
            "for completions without EOS"
        )
    if p.overlong_reward_penalty:
        # verl's DAPO reward manager: the same formula (reward_kwargs; newer verl spells the
        # prefix reward.reward_kwargs and reward.reward_manager.name).
        R = "+reward_model.reward_kwargs"
        out.kv += [
            ("reward_model.reward_manager", "dapo"),
            (f"{R}.overlong_buffer_cfg.enable", True),
            (f"{R}.overlong_buffer_cfg.len", p.overlong_tokens),
            (f"{R}.overlong_buffer_cfg.penalty_factor", p.overlong_penalty_factor),
            (f"{R}.overlong_buffer_cfg.log", True),
            (f"{R}.max_resp_len", r.max_new_tokens),
        ]
    if r.zero_variance_filter:
        out.kv += [
            ("algorithm.filter_groups.enable", True),
            ("algorithm.filter_groups.metric", "seq_reward"),
            ("algorithm.filter_groups.max_num_gen_batches", 1 + r.max_resample_rounds),
        ]
        out.notes.append(
            "# rollout.zero_variance_filter: verl's filter_groups raises when "
            "max_num_gen_batches run out (the harness trains on the groups left) and refills "
            "in data.gen_batch_size prompts"
        )
    return out


def _verl_loss(cfg: RunConfig) -> _Section:
    """The advantage estimator, the clip ratios, the objective's own keys, the loss aggregation and
    the stability options."""
    p = cfg.ppo
    A = "actor_rollout_ref.actor"
    est, extra, est_notes = _verl_estimator(cfg)
    out = _Section(notes=est_notes)
    if est is not None:
        out.kv.append(("algorithm.adv_estimator", est))
    out.kv += [tuple(e.split("=", 1)) for e in extra]  # type: ignore[misc]
    hi = p.eps_clip if p.eps_clip_higher is None else p.eps_clip_higher
    out.kv += [(f"{A}.clip_ratio_low", p.eps_clip), (f"{A}.clip_ratio_high", hi)]
    if p.c_clip is not None:
        out.kv.append((f"{A}.clip_ratio_c", p.c_clip))
    else:  # verl's vanilla loss always applies the dual clip; a huge c switches it off
        out.kv.append((f"{A}.clip_ratio_c", 1e9))
        if p.policy_loss != "dppo":  # DPPO writes its own clip_ratio_c (its truncation cap)
            out.notes.append(
                "# ppo.c_clip null: verl always dual-clips; clip_ratio_c=1e9 disables it"
            )
    loss = _verl_policy_loss(p, A)
    # An objective may give actor keys their own meaning (DPPO's δ in clip_ratio_*): its value
    # replaces the PPO-clip one in place, so every key is written once.
    own = dict(loss.kv)
    out.kv = [(k, own.pop(k)) if k in own else (k, v) for k, v in out.kv]
    out += _Section(list(own.items()), loss.notes)
    if p.loss_agg_mode == "prompt-mean":
        out.notes.append("# ppo.loss_agg_mode=prompt-mean: verl has no prompt-level loss_agg_mode")
    else:
        out.kv.append((f"{A}.loss_agg_mode", p.loss_agg_mode))
        if (f"{A}.policy_loss.loss_mode", "gspo") in loss.kv:
            out.notes.append(
                f"# loss_mode gspo: verl {VERL_VERSION} aggregates it by loss_agg_mode="
                f"{p.loss_agg_mode} (written below); verl <= 0.9.0 forces seq-mean-token-mean "
                "whatever loss_agg_mode says"
            )
    out += _verl_stability(cfg)
    return out


def _verl_optim(cfg: RunConfig) -> _Section:
    """Mini-batches, epochs, entropy and the optimizer with its schedule."""
    p, r, o = cfg.ppo, cfg.rollout, cfg.optim
    A = "actor_rollout_ref.actor"
    out = _Section()
    if r.prompts_per_step % p.ppo_n_minibatches:
        out.notes.append(
            f"# ppo.ppo_n_minibatches={p.ppo_n_minibatches}: verl's mini-batches count prompts "
            f"and {r.prompts_per_step} prompts do not divide evenly"
        )
    else:
        out.kv.append((f"{A}.ppo_mini_batch_size", r.prompts_per_step // p.ppo_n_minibatches))
    out.kv += [
        (f"{A}.ppo_epochs", p.ppo_epochs),
        (f"{A}.entropy_coeff", p.entropy_coef),
        (f"{A}.optim.lr", o.lr),
        (f"{A}.optim.weight_decay", o.weight_decay),
        (f"{A}.optim.betas", [o.beta1, o.beta2]),
        (f"{A}.grad_clip", o.grad_clip if o.grad_clip is not None else 1e9),
    ]
    if o.warmup_steps:
        out.kv.append((f"{A}.optim.lr_warmup_steps", o.warmup_steps))
    # verl's FSDP optimizer config allows warmup_style constant or cosine (asserted there).
    if o.schedule == "constant":
        out.kv.append((f"{A}.optim.warmup_style", "constant"))
    elif o.schedule == "cosine":  # the harness decays over half a cycle to 0, as verl's cosine
        out.kv += [
            (f"{A}.optim.warmup_style", "cosine"),
            (f"{A}.optim.min_lr_ratio", 0.0),
            (f"{A}.optim.num_cycles", 0.5),
        ]
    else:
        out.notes.append(
            f"# optim.schedule={o.schedule}: verl's FSDP optimizer has warmup_style constant or "
            "cosine only (no linear decay); not mapped"
        )
    return out


def _verl_model(cfg: RunConfig) -> _Section:
    """Gradient checkpointing, LoRA and the sampler's and learner's precision."""
    r, m = cfg.rollout, cfg.model_options
    out = _Section(
        [("actor_rollout_ref.model.enable_gradient_checkpointing", m.gradient_checkpointing)]
    )
    if m.lora is not None:
        out.kv += [
            ("actor_rollout_ref.model.lora_rank", m.lora.r),
            ("actor_rollout_ref.model.lora_alpha", m.lora.alpha),
            ("actor_rollout_ref.model.target_modules", lora_targets(cfg)),
        ]
        if m.lora.dropout:
            out.notes.append(
                f"# model_options.lora.dropout={m.lora.dropout}: verl's LoRA has no dropout "
                "option (its adapters run without dropout)"
            )
    # The sampler's precision (rollout.sampler_dtype, else the learner's) is verl's rollout
    # engine dtype; the learner's is its FSDP actor's, below.
    out.kv.append(("actor_rollout_ref.rollout.dtype", r.sampler_dtype or m.dtype))
    out.notes += sampler_notes(cfg, "verl", "actor_rollout_ref.rollout.dtype")
    out.notes += warm_start_note(cfg, "verl")
    if m.dtype == "bfloat16":
        out.notes.append(
            "# model_options.dtype=bfloat16: verl's FSDP actor already computes in bf16 over "
            "float32 master weights (its default mixed precision)"
        )
    else:
        out.notes.append(
            "# model_options.dtype=float32: verl's FSDP actor computes in bf16 by default; for "
            "float32 set its fsdp_config mixed_precision param_dtype to fp32 (where that key "
            "lives differs between verl versions)"
        )
    return out


def _verl_data(cfg: RunConfig) -> _Section:
    """Batch, lengths, sampling, the return's discount and the KL penalty, and the critic."""
    p, r = cfg.ppo, cfg.rollout
    out = _Section(
        [
            ("data.train_batch_size", r.prompts_per_step),
            ("data.max_response_length", r.max_new_tokens),
            ("actor_rollout_ref.rollout.n", r.n_samples),
            ("actor_rollout_ref.rollout.temperature", p.temperature),
            ("actor_rollout_ref.rollout.top_p", r.top_p),
            ("algorithm.gamma", p.discount),
            ("algorithm.lam", p.gae_lambda),
        ]
    )
    if p.kl_ctl > 0:
        out.kv += [
            ("algorithm.use_kl_in_reward", True),
            ("algorithm.kl_penalty", _VERL_KL[p.kl_estimator]),
            ("algorithm.kl_ctrl.type", "fixed"),
            ("algorithm.kl_ctrl.kl_coef", p.kl_ctl),
        ]
    if cfg.critic.enabled:
        out.kv.append(("critic.optim.lr", cfg.critic.lr))
        if cfg.critic.value_clip is not None:
            out.kv.append(("critic.cliprange_value", cfg.critic.value_clip))
    if r.staleness:
        out.notes.append(
            f"# rollout.staleness={r.staleness}: verl's main trainer is synchronous (no lagged "
            "policy); its recipe/one_step_off_policy trains exactly one step behind (staleness 1)"
        )
    out += _Section(*verl_async(cfg))
    return out


def _verl_correction(cfg: RunConfig) -> _Section:
    """The mismatch correction (verl's ``algorithm.rollout_correction``) and what verl lacks."""
    p = cfg.ppo
    out = _Section()
    if p.correction is not None:
        ckv, problems = verl_settings(resolve(p.correction), p.policy_loss)
        out.kv += [
            (k, Quoted(v) if isinstance(v, str) and not VERL_NAME.fullmatch(v) else v)
            for k, v in ckv
        ]
        out.notes += [f"# {f}: not expressible in verl ({why})" for f, why in problems]
    elif p.use_decoupled_loss or p.behave_imp_weight_mode != "disabled" or p.rejection_sampling:
        out.notes.append(
            "# ppo.use_decoupled_loss / behaviour weights: verl's algorithm.rollout_correction "
            "weighs rollout-vs-old policy mismatch, not a lagged sampler; not mapped"
        )
    if p.prox_logp_method != "recompute":
        out.notes.append(
            f"# ppo.prox_logp_method={p.prox_logp_method}: verl has no such option (it "
            "recomputes old_log_prob with a forward pass, or skips it in bypass mode)"
        )
    if (p.reward_scaling, p.reward_bias) != (1.0, 0.0):
        out.notes.append("# ppo.reward_scaling / reward_bias: verl has no reward shaping option")
    return out


def export_verl(cfg: RunConfig) -> str:
    head = f"# verl {VERL_VERSION} overrides (keys and loss semantics of that release)"
    out = _Section(notes=[head])
    for section in (_verl_loss, _verl_optim, _verl_model, _verl_data, _verl_correction):
        out += section(cfg)
    where = {"actor_rollout_ref.model.target_modules": "model_options.lora.target_modules"}
    lines = [override(k, _typed(v), where.get(k, k)) for k, v in out.kv]
    return "\n".join([comment(n.removeprefix("# ")) for n in out.notes] + lines) + "\n"


def _typed(v: Any) -> Any:
    """The estimator's extra overrides come as text ('False'); everything else is typed."""
    return {"False": False, "True": True}.get(v, v) if isinstance(v, str) else v

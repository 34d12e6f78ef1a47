"""``harness export``: one cell's settings in another framework's own names and format.

    trl     ``GRPOConfig(...)`` keyword arguments (TRL 1.16; ``harness/trainers/trl_map.py``)
    verl    Hydra overrides (``actor_rollout_ref.actor.clip_ratio_low=...``, one per line)
    areal   YAML under AReaL's keys (``actor.eps_clip``, ``actor.adv_norm.mean_level``, ...)

An option the target lacks is a ``#`` comment line naming it and why — never dropped silently.
Only settings of the algorithm and its budget are exported (not paths, devices or trackers).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml

from harness.config import RunConfig
from harness.configtools import to_dict
from harness.trainers.trl_map import approximations, grpo_kwargs, trl_problems

if TYPE_CHECKING:
    from harness.sweep.spec import StudySpec

TARGETS = ("trl", "verl", "areal")


def _py(v: Any) -> str:
    return repr(v)


def export_trl(cfg: RunConfig) -> str:
    lines = [f"# {field}: not expressible in TRL ({why})" for field, why in trl_problems(cfg)]
    lines += [f"# approximate: {a}" for a in approximations(cfg)]
    kw = grpo_kwargs(cfg, strict=False)
    body = "".join(f"    {k}={_py(v)},\n" for k, v in kw.items())
    return "\n".join(lines) + ("\n" if lines else "") + "GRPOConfig(\n" + body + ")\n"


_VERL_KL = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
_VERL_LOSS = {
    "ppo": "vanilla",
    "cispo": "cispo",
    "sapo": "sapo",
    "gmpo": "geo_mean",
    "clip_cov": "clip_cov",
    "kl_cov": "kl_cov",
}


def _verl_estimator(cfg: RunConfig) -> tuple[str | None, list[str], list[str]]:
    """(adv_estimator, extra overrides, comments) for the harness's advantage recipe."""
    p = cfg.ppo
    n, a = p.reward_norm, p.adv_norm
    if cfg.critic.enabled:
        notes = []
        if a is None or a.mean_level != "batch" or a.std_level != "batch":
            notes.append("# ppo.adv_norm: verl's gae always whitens advantages over the batch")
        return "gae", [], notes
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


def export_verl(cfg: RunConfig) -> str:
    p, r, o = cfg.ppo, cfg.rollout, cfg.optim
    A = "actor_rollout_ref.actor"
    out: list[str] = []
    notes: list[str] = []
    est, extra, est_notes = _verl_estimator(cfg)
    notes += est_notes
    if est is not None:
        out.append(f"algorithm.adv_estimator={est}")
    out += extra
    hi = p.eps_clip if p.eps_clip_higher is None else p.eps_clip_higher
    out += [f"{A}.clip_ratio_low={p.eps_clip}", f"{A}.clip_ratio_high={hi}"]
    if p.c_clip is not None:
        out.append(f"{A}.clip_ratio_c={p.c_clip}")
    else:  # verl's vanilla loss always applies the dual clip; a huge c switches it off
        out.append(f"{A}.clip_ratio_c=1e9")
        notes.append("# ppo.c_clip null: verl always dual-clips; clip_ratio_c=1e9 disables it")
    loss_mode = _VERL_LOSS[p.policy_loss]
    if p.policy_loss == "ppo" and p.importance_sampling_level == "sequence":
        loss_mode = "gspo"
    out.append(f"{A}.policy_loss.loss_mode={loss_mode}")
    if p.policy_loss == "clip_cov":
        out += [
            f"{A}.policy_loss.clip_cov_ratio={p.clip_cov_ratio}",
            f"{A}.policy_loss.clip_cov_lb={p.clip_cov_lb}",
            f"{A}.policy_loss.clip_cov_ub={p.clip_cov_ub}",
        ]
    if p.policy_loss == "kl_cov":
        out += [
            f"{A}.policy_loss.kl_cov_ratio={p.kl_cov_ratio}",
            f"{A}.policy_loss.ppo_kl_coef={p.kl_cov_coef}",
        ]
    if p.policy_loss in ("cispo", "sapo", "gmpo"):
        notes.append(
            f"# ppo.{p.policy_loss} hyper-parameters: not exported (verl's names for them are "
            "not pinned here; check verl's policy_loss config)"
        )
    out.append(f"{A}.loss_agg_mode={p.loss_agg_mode}")
    if r.prompts_per_step % p.ppo_n_minibatches:
        notes.append(
            f"# ppo.ppo_n_minibatches={p.ppo_n_minibatches}: verl's mini-batches count prompts "
            f"and {r.prompts_per_step} prompts do not divide evenly"
        )
    else:
        out.append(f"{A}.ppo_mini_batch_size={r.prompts_per_step // p.ppo_n_minibatches}")
    out.append(f"{A}.ppo_epochs={p.ppo_epochs}")
    out.append(f"{A}.entropy_coeff={p.entropy_coef}")
    out.append(f"{A}.optim.lr={o.lr}")
    out.append(f"{A}.optim.weight_decay={o.weight_decay}")
    out.append(f"{A}.grad_clip={o.grad_clip if o.grad_clip is not None else 1e9}")
    if o.warmup_steps:
        out.append(f"{A}.optim.lr_warmup_steps={o.warmup_steps}")
    if o.schedule != "constant":
        out.append(f"{A}.optim.warmup_style={o.schedule}")
    out += [
        f"data.train_batch_size={r.prompts_per_step}",
        f"data.max_response_length={r.max_new_tokens}",
        f"actor_rollout_ref.rollout.n={r.n_samples}",
        f"actor_rollout_ref.rollout.temperature={p.temperature}",
        f"actor_rollout_ref.rollout.top_p={r.top_p}",
        f"algorithm.gamma={p.discount}",
        f"algorithm.lam={p.gae_lambda}",
    ]
    if p.kl_ctl > 0:
        out += [
            "algorithm.use_kl_in_reward=True",
            f"algorithm.kl_penalty={_VERL_KL[p.kl_estimator]}",
            "algorithm.kl_ctrl.type=fixed",
            f"algorithm.kl_ctrl.kl_coef={p.kl_ctl}",
        ]
    if cfg.critic.enabled:
        out.append(f"critic.optim.lr={cfg.critic.lr}")
        if cfg.critic.value_clip is not None:
            out.append(f"critic.cliprange_value={cfg.critic.value_clip}")
    if r.staleness:
        notes.append("# rollout.staleness: verl's main trainer is synchronous (no lagged policy)")
    if p.use_decoupled_loss or p.behave_imp_weight_mode != "disabled" or p.rejection_sampling:
        notes.append(
            "# ppo.use_decoupled_loss / behaviour weights: verl's algorithm.rollout_correction "
            "weighs rollout-vs-old policy mismatch, not a lagged sampler; not mapped"
        )
    if (p.reward_scaling, p.reward_bias) != (1.0, 0.0):
        notes.append("# ppo.reward_scaling / reward_bias: verl has no reward shaping option")
    return "\n".join(notes + out) + "\n"


def export_areal(cfg: RunConfig) -> str:
    p, r, o = cfg.ppo, cfg.rollout, cfg.optim
    notes: list[str] = []
    actor: dict[str, Any] = {
        "eps_clip": p.eps_clip,
        "eps_clip_higher": p.eps_clip_higher,
        "c_clip": p.c_clip,
        "use_decoupled_loss": p.use_decoupled_loss,
        "recompute_logprob": p.recompute_logprob,
        "importance_sampling_level": p.importance_sampling_level,
        "ppo_n_minibatches": p.ppo_n_minibatches,
        "adv_norm": to_dict(p.adv_norm),
        "reward_norm": to_dict(p.reward_norm),
        "kl_ctl": p.kl_ctl,
        "kl_estimator": p.kl_estimator,
        "discount": p.discount,
        "gae_lambda": p.gae_lambda,
        "reward_scaling": p.reward_scaling,
        "reward_bias": p.reward_bias,
        "reward_clip": p.reward_clip,
        "temperature": p.temperature,
        "optimizer": {
            "lr": o.lr,
            "weight_decay": o.weight_decay,
            "beta1": o.beta1,
            "beta2": o.beta2,
            "gradient_clipping": o.grad_clip if o.grad_clip is not None else 1e9,
            "lr_scheduler_type": o.schedule,
        },
    }
    if p.rejection_sampling is not None:
        actor["rejection_sampling"] = to_dict(p.rejection_sampling)
    elif p.behave_imp_weight_mode != "disabled":
        actor["behave_imp_weight_mode"] = p.behave_imp_weight_mode
        actor["behave_imp_weight_cap"] = p.behave_imp_weight_cap
    if o.warmup_steps:
        notes.append(
            f"# optim.warmup_steps={o.warmup_steps}: AReaL takes a proportion "
            "(optimizer.warmup_steps_proportion) of the total steps"
        )
    if p.ppo_epochs != 1:
        notes.append(f"# ppo.ppo_epochs={p.ppo_epochs}: AReaL's actor makes one pass per batch")
    if p.loss_agg_mode != "token-mean":
        notes.append(f"# ppo.loss_agg_mode={p.loss_agg_mode}: AReaL's loss is the token mean")
    if p.policy_loss != "ppo":
        notes.append(f"# ppo.policy_loss={p.policy_loss}: AReaL's actor loss is PPO-clip")
    if p.entropy_coef:
        notes.append("# ppo.entropy_coef: AReaL's actor has no entropy bonus")
    if cfg.critic.enabled:
        notes.append("# critic.*: AReaL configures a critic as its own `critic:` engine block")
    doc: dict[str, Any] = {
        "actor": actor,
        "gconfig": {
            "n_samples": r.n_samples,
            "max_new_tokens": r.max_new_tokens,
            "temperature": p.temperature,
            "top_p": r.top_p,
        },
        "train_dataset": {"batch_size": r.prompts_per_step},
        "rollout": {"max_head_offpolicyness": r.staleness},
    }
    body = yaml.safe_dump(doc, sort_keys=False)
    return "\n".join(notes) + ("\n" if notes else "") + body


def export_cell(cfg: RunConfig, target: str) -> str:
    if target == "trl":
        return export_trl(cfg)
    if target == "verl":
        return export_verl(cfg)
    if target == "areal":
        return export_areal(cfg)
    raise ValueError(f"--to must be one of {', '.join(TARGETS)}; got {target!r}")


def _tokens(text: str) -> dict[str, str]:
    """'eps_clip=0.2 c_clip=3' → {'eps_clip': '0.2', 'c_clip': '3'} with values normalised the way
    cell labels print them (so 3, 3.0 and 3.00 agree)."""
    from harness.configtools import parse_override
    from harness.experiment import _fmt_value

    out = {}
    for tok in text.split():
        key, value = parse_override(tok)
        out[key] = _fmt_value(value)
    return out


def resolve_cell(spec: Any, text: str) -> tuple[str, dict[str, Any]]:
    """The experiment's cell that ``text`` names: its label, or ``key=value`` pairs that pick out
    exactly one cell (short or dotted keys, any order).  Raises ConfigError otherwise."""
    from harness.configtools import ConfigError

    for c in spec.cells:
        if c.label == text.strip():
            return c.label, dict(c.overrides)
    try:
        want = _tokens(text)
    except ConfigError:
        raise ConfigError(
            f"--cell {text!r}: expected the cell's label or KEY=VALUE pairs"
        ) from None
    matches = []
    for c in spec.cells:
        have = _tokens(c.label)
        dotted = {k: v for k, v in have.items()}
        for axis in spec.axes:  # dotted names of each axis are accepted too
            short = next((k for k in have if axis == k or axis.endswith("." + k)), None)
            if short is not None:
                dotted[axis] = have[short]
        if all(dotted.get(k) == v for k, v in want.items()):
            matches.append(c)
    labels = ", ".join(repr(c.label) for c in spec.cells)
    if len(matches) != 1:
        what = "matches no cell" if not matches else f"matches {len(matches)} cells"
        raise ConfigError(f"--cell {text!r} {what} of {spec.name} (cells: {labels})")
    return matches[0].label, dict(matches[0].overrides)


def best_cell(spec: StudySpec, study: Any) -> str:
    """The top cell of a finished study by the report's own ranking (IQM of the metric)."""
    from harness.configtools import ConfigError
    from harness.report import ranking
    from harness.sweep.results import load_study_data

    data = load_study_data(study, None)
    pending = [r for r in data.runs if r.status in ("running", "waiting")]
    if pending or not data.runs:
        raise ConfigError(
            f"--best: study {study.study_name!r} is not finished "
            f"({len(data.runs) - len(pending)} of {len(data.runs)} runs done)"
        )
    rows = ranking(data, n_boot=200)
    return rows[0].label

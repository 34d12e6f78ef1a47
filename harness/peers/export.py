"""``harness export``: one cell's settings in another framework's own names and format.

    trl     a Python snippet: ``args = GRPOConfig(...)`` (TRL 1.16; ``harness/peers/trl.py``)
            and, with LoRA, ``peft_config = LoraConfig(...)`` for ``GRPOTrainer``
    verl    Hydra overrides (``actor_rollout_ref.actor.clip_ratio_low=...``, one per line,
            shell-quoted where the shell would otherwise read them)
    areal   YAML under AReaL's keys (``actor.eps_clip``, ``actor.adv_norm.mean_level``, ...)

An option the target lacks is a ``#`` comment line naming it and why — never dropped silently.
Only settings of the algorithm, its budget and how the model is trained (precision, gradient
checkpointing, LoRA) are exported; not paths, devices (beyond what TRL must be told) or trackers.

Everything user-controlled that reaches the text (file names, cell labels, LoRA module names) is
escaped for the target: comments are one line whatever they quote (:func:`comment`), TRL values
are Python literals (``repr``), AReaL values go through ``yaml.safe_dump``, and verl strings are
refused unless they are plain module names (Hydra would interpolate ``${...}`` inside quotes).
"""

from __future__ import annotations

import math
import re
import shlex
from typing import TYPE_CHECKING, Any

import torch
import yaml

from harness.core.configtools import ConfigError, to_dict
from harness.peers.corrections import verl_settings
from harness.peers.trl import VLLM_ONLY, approximations, grpo_kwargs, trl_problems
from harness.ppo.corrections import legacy_to_rejection_sampling, resolve
from harness.ppo.objectives import lookup

if TYPE_CHECKING:
    from harness.config import RunConfig

TARGETS = ("trl", "verl", "areal")
# The verl release the overrides are written for: keys and loss semantics move between releases
# (0.9.1's gspo follows loss_agg_mode; up to 0.9.0 it forced seq-mean-token-mean).
VERL_VERSION = "0.9.1"


def one_line(text: Any) -> str:
    """``text`` with every character that could end a line (in Python, YAML or a shell: \\n,
    \\r, \\x85, \\u2028, ...) or hide one (any other non-printable) written as its escape."""
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text)
    )


def comment(text: Any) -> str:
    """A ``#`` comment line that stays one line (and so stays a comment) whatever it quotes."""
    return "# " + one_line(text)


def _py(v: Any) -> str:
    """A Python literal of ``v`` (``repr``; ±inf as ``float('inf')``, which has no literal)."""
    if isinstance(v, float) and not math.isfinite(v):
        if math.isnan(v):
            raise ValueError("NaN has no exported value")
        return "float('inf')" if v > 0 else "-float('inf')"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_py(x) for x in v) + "]"
    return repr(v)


def _lora_targets(cfg: RunConfig) -> str | list[str]:
    """The LoRA target modules as peft takes them (the harness's ``[all-linear]`` is peft's
    ``"all-linear"`` shorthand, as in ``harness.model.lora.apply_lora``)."""
    lora = cfg.model_options.lora
    assert lora is not None
    targets = list(lora.target_modules)
    return "all-linear" if targets == ["all-linear"] else targets


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


def _warm_start_note(cfg: RunConfig, target: str) -> list[str]:
    """The warm start is a separate supervised phase no target's RL config holds."""
    w = cfg.warm_start
    if not w.steps:
        return []
    return [
        f"# warm_start.steps={w.steps} (lr {w.lr}, batch_size {w.batch_size}): the harness "
        f"fine-tunes on the task's demonstrations before RL; {target}'s RL trainer has no such "
        "phase: run SFT first (e.g. TRL's SFTTrainer) and start RL from that checkpoint"
    ]


def _sampler_notes(cfg: RunConfig, target: str, dtype_key: str | None) -> list[str]:
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
    lines += [comment(n.removeprefix("# ")) for n in _warm_start_note(cfg, "TRL")]
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
                "log W += Σ_t clamp(log ρ_t, log 1e-8, 20); the loss is not multiplied by ρ)"
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
            "target_modules": _lora_targets(cfg),
            "bias": "none",
            "task_type": "CAUSAL_LM",
        }
        code.append(
            "peft_config = LoraConfig("
            + ", ".join(f"{k}={_py(v)}" for k, v in lora_kw.items())
            + ")"
        )
    code.append("args = GRPOConfig(")
    code += [f"    {k}={_py(v)}," for k, v in kw.items()]
    code.append(")")
    trainer = "GRPOTrainer(model=..., reward_funcs=..., args=args"
    trainer += ", peft_config=peft_config)" if lora is not None else ")"
    code.append(comment(f"then: {trainer}"))
    return "\n".join(lines + code) + "\n"


_VERL_KL = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}


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


# A string verl gets unquoted: a plain module name.  Anything else is refused rather than
# quoted: Hydra still resolves ${...} inside quoted values, and words such as true/null/inf
# would change type.
_VERL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_HYDRA_WORDS = {"true", "false", "null", "none", "inf", "nan"}


class _Quoted(str):
    """A string the export itself composed from numbers and option names (verl's "0.5_5.0"
    thresholds, "token_k1,seq_mean_k3" lists): double-quoted for Hydra, never user text."""


_QUOTABLE = re.compile(r"[A-Za-z0-9_.,+\-]+")


def _hydra(v: Any, where: str) -> str:
    """A Hydra override value for ``v`` (bool, number, None, plain name, or a list of them)."""
    if isinstance(v, _Quoted):
        if not _QUOTABLE.fullmatch(v):  # pragma: no cover - composed from numbers and names
            raise ValueError(f"{where}: {v!r} is not a composed verl value")
        return f'"{v}"'
    if isinstance(v, bool):
        return "True" if v else "False"
    if v is None:
        return "null"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            raise ValueError("NaN has no exported value")
        if not math.isfinite(v):
            return "inf" if v > 0 else "-inf"
        text = repr(v)
        if "e" not in text and len(text) > 8:  # 1000000000.0 -> 1e9, when exact
            digits = next(d for d in range(17) if float(f"{v:.{d}e}") == v)
            mantissa, exp = f"{v:.{digits}e}".split("e")
            short = f"{mantissa}e{int(exp)}"
            text = short if len(short) < len(text) else text
        return text
    if isinstance(v, list | tuple):
        return "[" + ",".join(_hydra(x, where) for x in v) + "]"
    text = str(v)
    if not _VERL_NAME.fullmatch(text) or text.lower() in _HYDRA_WORDS:
        raise ConfigError(
            f"{where}: {text!r} cannot be written as a verl override (module names are letters, "
            "digits, '_', '.', '-', starting with a letter or '_')"
        )
    return text


def _override(key: str, value: Any, where: str = "") -> str:
    """``key=value`` for verl's command line, shell-quoted when the shell would read it
    (``[...]`` is a glob pattern)."""
    return shlex.quote(f"{key}={_hydra(value, where or key)}")


def _verl_policy_loss(p: Any, A: str) -> tuple[list[tuple[str, Any]], list[str]]:
    """verl's ``policy_loss.loss_mode`` and the objective's options, from its declaration."""
    o = lookup(p.policy_loss)
    peer = o.verl
    c = resolve(p.correction)
    if o.name == "reinforce" and c is not None and c.bypass:
        # verl's bypass_mode loss replaces loss_mode; REINFORCE there is chosen by
        # algorithm.rollout_correction.loss_type (written with the correction).
        return [], []
    if peer is None:
        return [], [f"# ppo.policy_loss={o.name}: verl has no loss_mode for it"]
    options = getattr(p, o.name, None)
    mode = peer.name_for(p.importance_sampling_level, options)
    kv: list[tuple[str, Any]] = [(f"{A}.policy_loss.loss_mode", mode)]
    if o.name == "dppo":
        dppo_kv, dppo_notes = _verl_dppo(p, A)
        return kv + dppo_kv, dppo_notes
    if peer.options is None:
        why = (
            peer.note
            or "verl's names for them are not pinned here; check verl's policy_loss config"
        )
        notes = [f"# ppo.{o.name} hyper-parameters: not exported ({why})"]
        return (kv, notes) if o.options is not None else (kv, [])
    kv += [
        (f"{A}.policy_loss.{theirs}", getattr(options, ours))
        for ours, theirs in peer.options.items()
    ]
    return kv, []


def _verl_dppo(p: Any, A: str) -> tuple[list[tuple[str, Any]], list[str]]:
    """verl's dppo_tv / dppo_kl read δ from actor.clip_ratio_low/high and truncate r at
    actor.clip_ratio_c: those keys carry DPPO's own values (they replace the PPO-clip ones)."""
    o = p.dppo
    lo, hi = o.deltas()
    kv: list[tuple[str, Any]] = [(f"{A}.clip_ratio_low", lo), (f"{A}.clip_ratio_high", hi)]
    notes = []
    if o.surrogate == "truncated_is":
        kv.append((f"{A}.clip_ratio_c", o.cap()))
    else:
        kv.append((f"{A}.clip_ratio_c", 1e9))
        notes.append(
            "# ppo.dppo.surrogate=ratio: verl's dppo loss is −A·sg(min(r, clip_ratio_c))·log π; "
            "with clip_ratio_c=1e9 its gradient equals this cell's −A·r, its loss value does "
            "not (set ppo.dppo.surrogate truncated_is for verl's surrogate)"
        )
    if o.kl_tau:
        notes.append(
            f"# ppo.dppo.kl_tau={o.kl_tau}: verl's dppo loss has no drift term "
            "kl_tau·(ℓθ − ℓμ)² (prime-rl's default loss); not exported"
        )
    if o.anchor == "behaviour" and p.use_decoupled_loss:
        notes.append(
            "# ppo.dppo.anchor=behaviour: verl anchors DPPO at old_log_prob (π_prox under the "
            "decoupled loss); set ppo.dppo.anchor proximal for verl's"
        )
    return kv, notes


def _verl_stability(cfg: RunConfig) -> tuple[list[tuple[str, Any]], list[str]]:
    """The stability options in verl's DAPO recipe (``recipe.dapo.main_dapo``: its reward
    manager and ``algorithm.filter_groups``); what verl has no key for is a comment."""
    p, r = cfg.ppo, cfg.rollout
    kv: list[tuple[str, Any]] = []
    notes: list[str] = []
    if p.top_entropy_quantile < 1.0:
        notes.append(
            f"# ppo.top_entropy_quantile={p.top_entropy_quantile}: verl's actor has no "
            "top-entropy token mask"
        )
    if p.truncated_completions != "keep":
        notes.append(
            f"# ppo.truncated_completions={p.truncated_completions}: verl's actor has no option "
            "for completions without EOS"
        )
    if p.overlong_reward_penalty:
        # verl's DAPO reward manager: the same formula (reward_kwargs; newer verl spells the
        # prefix reward.reward_kwargs and reward.reward_manager.name).
        R = "+reward_model.reward_kwargs"
        kv += [
            ("reward_model.reward_manager", "dapo"),
            (f"{R}.overlong_buffer_cfg.enable", True),
            (f"{R}.overlong_buffer_cfg.len", p.overlong_tokens),
            (f"{R}.overlong_buffer_cfg.penalty_factor", p.overlong_penalty_factor),
            (f"{R}.overlong_buffer_cfg.log", True),
            (f"{R}.max_resp_len", r.max_new_tokens),
        ]
    if r.zero_variance_filter:
        kv += [
            ("algorithm.filter_groups.enable", True),
            ("algorithm.filter_groups.metric", "seq_reward"),
            ("algorithm.filter_groups.max_num_gen_batches", 1 + r.max_resample_rounds),
        ]
        notes.append(
            "# rollout.zero_variance_filter: verl's filter_groups raises when "
            "max_num_gen_batches run out (the harness trains on the groups left) and refills "
            "in data.gen_batch_size prompts"
        )
    return kv, notes


def export_verl(cfg: RunConfig) -> str:
    p, r, o, m = cfg.ppo, cfg.rollout, cfg.optim, cfg.model_options
    A = "actor_rollout_ref.actor"
    kv: list[tuple[str, Any]] = []
    notes: list[str] = []
    est, extra, est_notes = _verl_estimator(cfg)
    notes += est_notes
    if est is not None:
        kv.append(("algorithm.adv_estimator", est))
    kv += [tuple(e.split("=", 1)) for e in extra]  # type: ignore[misc]
    hi = p.eps_clip if p.eps_clip_higher is None else p.eps_clip_higher
    kv += [(f"{A}.clip_ratio_low", p.eps_clip), (f"{A}.clip_ratio_high", hi)]
    if p.c_clip is not None:
        kv.append((f"{A}.clip_ratio_c", p.c_clip))
    else:  # verl's vanilla loss always applies the dual clip; a huge c switches it off
        kv.append((f"{A}.clip_ratio_c", 1e9))
        if p.policy_loss != "dppo":  # DPPO writes its own clip_ratio_c (its truncation cap)
            notes.append("# ppo.c_clip null: verl always dual-clips; clip_ratio_c=1e9 disables it")
    kv_loss, loss_notes = _verl_policy_loss(p, A)
    # An objective may give actor keys their own meaning (DPPO's δ in clip_ratio_*): its value
    # replaces the PPO-clip one in place, so every key is written once.
    own = dict(kv_loss)
    kv = [(k, own.pop(k)) if k in own else (k, v) for k, v in kv]
    kv += list(own.items())
    notes += loss_notes
    if p.loss_agg_mode == "prompt-mean":
        notes.append("# ppo.loss_agg_mode=prompt-mean: verl has no prompt-level loss_agg_mode")
    else:
        kv.append((f"{A}.loss_agg_mode", p.loss_agg_mode))
        if (f"{A}.policy_loss.loss_mode", "gspo") in kv_loss:
            notes.append(
                f"# loss_mode gspo: verl {VERL_VERSION} aggregates it by loss_agg_mode="
                f"{p.loss_agg_mode} (written below); verl <= 0.9.0 forces seq-mean-token-mean "
                "whatever loss_agg_mode says"
            )
    stab_kv, stab_notes = _verl_stability(cfg)
    kv += stab_kv
    notes += stab_notes
    if r.prompts_per_step % p.ppo_n_minibatches:
        notes.append(
            f"# ppo.ppo_n_minibatches={p.ppo_n_minibatches}: verl's mini-batches count prompts "
            f"and {r.prompts_per_step} prompts do not divide evenly"
        )
    else:
        kv.append((f"{A}.ppo_mini_batch_size", r.prompts_per_step // p.ppo_n_minibatches))
    kv += [
        (f"{A}.ppo_epochs", p.ppo_epochs),
        (f"{A}.entropy_coeff", p.entropy_coef),
        (f"{A}.optim.lr", o.lr),
        (f"{A}.optim.weight_decay", o.weight_decay),
        (f"{A}.optim.betas", [o.beta1, o.beta2]),
        (f"{A}.grad_clip", o.grad_clip if o.grad_clip is not None else 1e9),
    ]
    if o.warmup_steps:
        kv.append((f"{A}.optim.lr_warmup_steps", o.warmup_steps))
    # verl's FSDP optimizer config allows warmup_style constant or cosine (asserted there).
    if o.schedule == "constant":
        kv.append((f"{A}.optim.warmup_style", "constant"))
    elif o.schedule == "cosine":  # the harness decays over half a cycle to 0, as verl's cosine
        kv += [
            (f"{A}.optim.warmup_style", "cosine"),
            (f"{A}.optim.min_lr_ratio", 0.0),
            (f"{A}.optim.num_cycles", 0.5),
        ]
    else:
        notes.append(
            f"# optim.schedule={o.schedule}: verl's FSDP optimizer has warmup_style constant or "
            "cosine only (no linear decay); not mapped"
        )
    kv.append(("actor_rollout_ref.model.enable_gradient_checkpointing", m.gradient_checkpointing))
    if m.lora is not None:
        kv += [
            ("actor_rollout_ref.model.lora_rank", m.lora.r),
            ("actor_rollout_ref.model.lora_alpha", m.lora.alpha),
            ("actor_rollout_ref.model.target_modules", _lora_targets(cfg)),
        ]
        if m.lora.dropout:
            notes.append(
                f"# model_options.lora.dropout={m.lora.dropout}: verl's LoRA has no dropout "
                "option (its adapters run without dropout)"
            )
    # The sampler's precision (rollout.sampler_dtype, else the learner's) is verl's rollout
    # engine dtype; the learner's is its FSDP actor's, below.
    kv.append(("actor_rollout_ref.rollout.dtype", r.sampler_dtype or m.dtype))
    notes += _sampler_notes(cfg, "verl", "actor_rollout_ref.rollout.dtype")
    notes += _warm_start_note(cfg, "verl")
    if m.dtype == "bfloat16":
        notes.append(
            "# model_options.dtype=bfloat16: verl's FSDP actor already computes in bf16 over "
            "float32 master weights (its default mixed precision)"
        )
    else:
        notes.append(
            "# model_options.dtype=float32: verl's FSDP actor computes in bf16 by default; for "
            "float32 set its fsdp_config mixed_precision param_dtype to fp32 (where that key "
            "lives differs between verl versions)"
        )
    kv += [
        ("data.train_batch_size", r.prompts_per_step),
        ("data.max_response_length", r.max_new_tokens),
        ("actor_rollout_ref.rollout.n", r.n_samples),
        ("actor_rollout_ref.rollout.temperature", p.temperature),
        ("actor_rollout_ref.rollout.top_p", r.top_p),
        ("algorithm.gamma", p.discount),
        ("algorithm.lam", p.gae_lambda),
    ]
    if p.kl_ctl > 0:
        kv += [
            ("algorithm.use_kl_in_reward", True),
            ("algorithm.kl_penalty", _VERL_KL[p.kl_estimator]),
            ("algorithm.kl_ctrl.type", "fixed"),
            ("algorithm.kl_ctrl.kl_coef", p.kl_ctl),
        ]
    if cfg.critic.enabled:
        kv.append(("critic.optim.lr", cfg.critic.lr))
        if cfg.critic.value_clip is not None:
            kv.append(("critic.cliprange_value", cfg.critic.value_clip))
    if r.staleness:
        notes.append("# rollout.staleness: verl's main trainer is synchronous (no lagged policy)")
    if p.correction is not None:
        ckv, problems = verl_settings(resolve(p.correction), p.policy_loss)
        kv += [
            (k, _Quoted(v) if isinstance(v, str) and not _VERL_NAME.fullmatch(v) else v)
            for k, v in ckv
        ]
        notes += [f"# {f}: not expressible in verl ({why})" for f, why in problems]
    elif p.use_decoupled_loss or p.behave_imp_weight_mode != "disabled" or p.rejection_sampling:
        notes.append(
            "# ppo.use_decoupled_loss / behaviour weights: verl's algorithm.rollout_correction "
            "weighs rollout-vs-old policy mismatch, not a lagged sampler; not mapped"
        )
    if p.prox_logp_method != "recompute":
        notes.append(
            f"# ppo.prox_logp_method={p.prox_logp_method}: verl has no such option (it "
            "recomputes old_log_prob with a forward pass, or skips it in bypass mode)"
        )
    if (p.reward_scaling, p.reward_bias) != (1.0, 0.0):
        notes.append("# ppo.reward_scaling / reward_bias: verl has no reward shaping option")
    where = {"actor_rollout_ref.model.target_modules": "model_options.lora.target_modules"}
    out = [_override(k, _typed(v), where.get(k, k)) for k, v in kv]
    notes.insert(0, f"# verl {VERL_VERSION} overrides (keys and loss semantics of that release)")
    return "\n".join([comment(n.removeprefix("# ")) for n in notes] + out) + "\n"


def _typed(v: Any) -> Any:
    """The estimator's extra overrides come as text ('False'); everything else is typed."""
    return {"False": False, "True": True}.get(v, v) if isinstance(v, str) else v


def export_areal(cfg: RunConfig) -> str:
    p, r, o, m = cfg.ppo, cfg.rollout, cfg.optim, cfg.model_options
    notes: list[str] = []

    def norm(n: Any, name: str) -> Any:
        # AReaL's NormConfig takes the group size from its own field (default 1: groups of one
        # sample, i.e. no group normalization at all): the cell's group is n_samples.
        d = to_dict(n)
        if isinstance(d, dict):
            d["group_size"] = r.n_samples
            # AReaL's NormConfig always divides by a std (or nothing): MaxRL's mean divisor is
            # named in a comment, not written as a key AReaL would refuse.
            if d.pop("divide_by", "std") == "mean":
                notes.append(
                    f"# ppo.{name}.divide_by=mean: AReaL's NormConfig has no mean divisor "
                    "(MaxRL); written without it, i.e. centred and not divided"
                )
        return d

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
    if m.dtype == "bfloat16":
        notes.append(
            "# model_options.dtype=bfloat16: approximate; AReaL's actor.dtype is the parameter "
            "dtype, the harness keeps float32 master weights under bf16 autocast"
        )
    notes += _sampler_notes(cfg, "AReaL", None)
    notes += _warm_start_note(cfg, "AReaL")
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

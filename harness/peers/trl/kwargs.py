"""The algorithm's TRL 1.16 ``GRPOConfig`` keyword arguments for a config (``grpo_kwargs``)."""

from __future__ import annotations

from typing import Any

from harness.config.schema import RunConfig
from harness.config.trainer_checks import refusal
from harness.peers.corrections import trl_settings
from harness.peers.trl.problems import model_opt, policy_loss_of, trl_problems, uses_engine
from harness.ppo.corrections import Correction
from harness.ppo.objectives import lookup

_LOSS_TYPE = {
    "token-mean": "bnpo",
    "seq-mean-token-mean": "grpo",
    "seq-mean-token-sum": "luspo",
    "seq-mean-token-sum-norm": "dr_grpo",
}
_SCHEDULE = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def grpo_kwargs(cfg: RunConfig, *, strict: bool = True) -> dict[str, Any]:
    """The algorithm's ``GRPOConfig`` keyword arguments for ``cfg``.  ``strict``: raise
    ``ValueError`` naming the first inexpressible option; otherwise leave out what TRL cannot say
    (``harness export`` names it in a comment)."""
    problems = trl_problems(cfg)
    if problems and strict:
        raise ValueError(refusal("trl", problems[:1]))
    p, r = cfg.ppo, cfg.rollout
    batch = r.prompts_per_step * r.n_samples
    pl = policy_loss_of(cfg)
    trl_peer = lookup(pl).trl
    loss_type = (
        trl_peer.name
        if trl_peer is not None and trl_peer.name
        else _LOSS_TYPE.get(p.loss_agg_mode, "")
    )
    bad = {field.split(".")[1] if "." in field else field for field, _ in problems}
    kw = _plain_kwargs(cfg, loss_type, batch)
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
    if isinstance(p.correction, Correction):  # a preset's name is resolved when it is built
        # The correction under TRL's names (the vLLM weights act only with TRL's engine: without
        # it they are refused above, and reach only an exported config).
        kw.update(trl_settings(p.correction)[0])
    if uses_engine(cfg):
        kw["use_vllm"] = True
        kw["vllm_mode"] = "colocate"
        kw["vllm_gpu_memory_utilization"] = r.engine_gpu_memory_utilization
        # TRL's default is a sequence_mask correction; the harness applies one only when
        # ppo.correction names a weight.
        kw.setdefault("vllm_importance_sampling_correction", False)
    if trl_peer is not None and trl_peer.options:
        # The objective's own options under TRL's names (cispo's cap is TRL's epsilon_high).
        options = getattr(p, pl)
        for ours, theirs in trl_peer.options.items():
            kw[theirs] = getattr(options, ours)
    return kw


def _plain_kwargs(cfg: RunConfig, loss_type: str, batch: int) -> dict[str, Any]:
    """The arguments every TRL run of ``cfg`` names, each one harness option read as is."""
    p, r, o = cfg.ppo, cfg.rollout, cfg.optim
    return {
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
        "bf16": model_opt(cfg, "dtype", "float32") == "bfloat16",
        "gradient_checkpointing": bool(model_opt(cfg, "gradient_checkpointing", False)),
    }

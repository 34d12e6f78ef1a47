"""One PPO training run — the one readable loop.

    for step in range(steps):
        rollout    sample prompts → the behaviour policy (k updates stale) samples n completions
        rewards    the task scores each completion
        advantages shape → reward_norm → KL to the reference → GAE → adv_norm   (PPOActor)
        update     ppo_epochs × ppo_n_minibatches optimizer steps               (PPOActor)
        critic     value-model update (when enabled)
        metrics    one dict per step, recorded by the run scaffold

What every trainer shares — seeds, the warm-started model, the start eval, recording, divergence,
interruption and the summary — is the scaffold's (``harness/run/scaffold.py``); this file is the
PPO algorithm only.  The loop knows no tracker and no sweep: it reports through the scaffold's
hooks and returns a ``RunResult``.  Metric names are defined once in ``harness/metrics/__init__.py``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import random
import time
import warnings
from collections.abc import Callable
from typing import Any, Unpack

import torch

from harness.config import RunConfig
from harness.model.build import autocast_dtype as precision_dtype
from harness.model.build import precision
from harness.model.critic import ValueModel, explained_variance, value_loss
from harness.model.lora import is_lora, reference_off, swapped_in
from harness.ppo.actor import PPOActor, minibatch_indices
from harness.run.dynamic_sampling import Round, option_metrics, refill, round_metrics, score_round
from harness.run.dynamic_sampling import skipped_step_metrics as _skipped
from harness.run.mismatch import mismatch_probe
from harness.run.rollout import NonFiniteLogits, StalenessRing, forward_logprobs
from harness.run.sampler import Sampler, build_sampler
from harness.run.scaffold import (
    Diverged,
    Hooks,
    Run,
    RunResult,
    clip_is_inert,
    execute,
    is_numeric_overflow,
    params_finite,
)
from harness.tasks import score_parts


def run(cfg: RunConfig, **hooks: Unpack[Hooks]) -> RunResult:
    """Train one policy with PPO as configured; never raises for a diverged run (it is returned
    with status 'diverged' and the metrics up to that step)."""
    return execute(cfg, ppo_steps, hooks)


def ppo_steps(run: Run) -> None:
    """The PPO steps on the scaffold's warm-started policy ``run.model``."""
    # One precision for recompute, reference, update and critic (models.ModelOptions); the
    # sampler's is rollout.sampler_dtype (default: the same), a mismatch source (docs/mismatch.md).
    amp = precision_dtype(run.cfg.model_options.dtype)
    sampler = build_sampler(run.cfg, run.device, amp, run.sample_kw)
    try:
        _train(run, sampler, amp)
    finally:
        # An inference engine lives as long as the run, whatever ends it.
        close = getattr(sampler, "close", None)
        if callable(close):
            close()


def _train(run: Run, sampler: Sampler, amp: torch.dtype | None) -> None:
    cfg, model, tokenizer, task, device = run.cfg, run.model, run.tokenizer, run.task, run.device
    probe = mismatch_probe(cfg, device, amp)
    lora = is_lora(model)

    # ---- models: the policy, a frozen reference, a behaviour copy, a critic
    # Eval mode except inside the update (PPOActor.ppo_update switches to train mode there, which
    # gradient checkpointing needs). Every dropout is zeroed at load time, so the mode changes
    # nothing else; LoRA's own dropout, if configured, is live in the update only.
    model.eval()
    # KL reference: a frozen full copy, or under LoRA the same model with adapters disabled.
    kl_on = cfg.ppo.kl_ctl > 0
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if kl_on and not lora else None
    # Behaviour policy k updates stale: a full copy, or under LoRA old adapters swapped in.
    ring = StalenessRing(cfg.rollout.staleness, trainable_only=lora)
    behaviour_model = (
        copy.deepcopy(model).eval().requires_grad_(False)
        if cfg.rollout.staleness and not lora
        else None
    )
    ring.push(model)

    critic = critic_opt = None
    if cfg.critic.enabled:
        critic = ValueModel(model).to(device).eval()
        critic_opt = torch.optim.AdamW(
            [p for p in critic.parameters() if p.requires_grad], lr=cfg.critic.lr
        )

    o = cfg.optim
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],  # the adapters only, under LoRA
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        weight_decay=o.weight_decay,
        fused=True,  # one kernel for all parameters: ~4x cheaper than the per-tensor loop on CPU
    )
    total_updates = cfg.steps * cfg.ppo.ppo_n_minibatches * cfg.ppo.ppo_epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(cfg, total_updates))
    actor = PPOActor(
        cfg.ppo,
        model,
        optimizer,
        scheduler=scheduler,
        grad_clip=o.grad_clip,
        autocast_dtype=amp,
        generator=torch.Generator().manual_seed(cfg.seed),
    )

    if clip_is_inert(cfg):
        warnings.warn(
            "clipping is inert in this configuration (one optimizer step per batch on fresh or "
            "recomputed log-probs: the ratio is identically 1), so eps_clip, eps_clip_higher and "
            "c_clip cannot change the run; use ppo_n_minibatches > 1, ppo_epochs > 1 or staleness",
            UserWarning,
            stacklevel=2,
        )

    rng = random.Random(cfg.seed)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    max_new = cfg.rollout.max_new_tokens
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def draw(policy: Any, step: int, examples: list[Any] | None = None) -> Round:
        """One sampling round of the behaviour policy, scored (new prompts unless given)."""
        if examples is None:
            examples = task.sample(rng, cfg.rollout.prompts_per_step)
        try:
            rb = sampler.sample(
                policy,
                tokenizer,
                [e.prompt for e in examples],
                n_samples=cfg.rollout.n_samples,
                max_new_tokens=max_new,
                temperature=cfg.ppo.temperature,
                top_p=cfg.rollout.top_p,
                generator=gen,
            )
        except NonFiniteLogits as err:  # anything else sampling raises is an error
            raise Diverged(step, f"non-finite probabilities while sampling ({err})") from None
        if not torch.isfinite(rb.logprobs).all():
            raise Diverged(step, "non-finite behaviour log-probs in the rollout")
        # 2. Rewards: one deterministic score per completion (+ the overlong penalty).
        per_row = [e for e in examples for _ in range(cfg.rollout.n_samples)]
        parts = [score_parts(task, e, c) for e, c in zip(per_row, rb.completions, strict=True)]
        return score_round(Round(rb, per_row, parts), cfg.ppo, max_new, device)

    skipped = 0  # steps whose update dynamic sampling skipped (no group left)
    version = 0  # the learner's policy version: updates made so far (AReaL's get_version)
    for step in range(cfg.steps):
        if run.stop_requested(step):
            break
        t0 = time.perf_counter()

        # 1. Rollout: the behaviour policy is the policy as it was `staleness` updates ago.
        examples = task.sample(rng, cfg.rollout.prompts_per_step)
        policy_for_sampling = model
        stale = ring.behaviour_state()
        sampled_version = version - ring.lag  # the version of the weights that sample this step
        swap: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if behaviour_model is not None and stale is not None:
            behaviour_model.load_state_dict(stale)
            policy_for_sampling = behaviour_model
        elif lora and stale is not None:
            swap = swapped_in(model, stale)
        # The sampler runs at its own precision (rollout.sampler_dtype; run/sampler.py).
        with swap:
            first = draw(policy_for_sampling, step, examples)
            # Dynamic sampling: zero-variance groups out, more rounds in (run/dynamic_sampling.py).
            dyn = None
            if cfg.rollout.zero_variance_filter:
                dyn = refill(
                    first,
                    functools.partial(draw, policy_for_sampling, step),
                    cfg.rollout.prompts_per_step,
                    cfg.rollout.max_resample_rounds,
                    pad_id,
                )
            train = dyn.train if dyn is not None else first
            # ℓsnap for the mismatch decomposition, while the sampling weights are still loaded.
            snap_logprobs = (
                probe.snapshot(policy_for_sampling, train.rb, stale=stale is not None)
                if train is not None
                else None
            )
        t_rollout = time.perf_counter() - t0
        rounds = dyn.rounds if dyn is not None else [first]
        run.scored(step, [e.prompt for r in rounds for e in r.per_row])
        if train is None:  # every group zero-variance: nothing to learn from, no update
            skipped += 1
            run.tags["skipped_updates"] = (
                f"{skipped} step(s) without an update: every group's rewards were equal "
                "(rollout.zero_variance_filter)"
            )
            metrics = _skipped(cfg, first, dyn, t0, t_rollout)
            if run.eval_due(step):
                with precision(device, amp):
                    metrics.update(run.evaluate(model))
            run.record(step, metrics, all_updates_nonfinite=False)
            continue
        batch: dict[str, Any] = {
            "input_ids": train.rb.input_ids,
            "attention_mask": train.rb.attention_mask,
            "loss_mask": train.rb.loss_mask,
            "logprobs": train.rb.logprobs,
            "rewards": train.rewards,
            "group_sizes": train.rb.group_sizes,
            "truncated": train.rb.truncated,
        }
        if cfg.ppo.interpolates_proximal:
            # AReaL's per-token versions (every token of a step comes from one snapshot here).
            lm = train.rb.loss_mask.bool()
            batch["versions"] = torch.where(lm, sampled_version, -1).long()
            batch["current_version"] = version
        with torch.no_grad(), precision(device, amp):
            if kl_on:
                with reference_off(model) if lora else contextlib.nullcontext():
                    batch["ref_logprobs"] = forward_logprobs(
                        ref_model if ref_model is not None else model,
                        batch["input_ids"],
                        batch["attention_mask"],
                        temperature=cfg.ppo.temperature,
                    )[0]
            if critic is not None:
                batch["values"] = critic(batch["input_ids"], batch["attention_mask"])

        # 3. Advantages (and the proximal log-probs at the current weights, if decoupled).
        actor.compute_advantages(batch)

        # 4. Minibatch PPO updates.
        t1 = time.perf_counter()
        try:
            stats = actor.ppo_update(batch)
        except RuntimeError as err:  # e.g. Adam's step overflowing float32
            if not is_numeric_overflow(err):
                raise
            msg = str(err).splitlines()[0]
            raise Diverged(step, f"the update overflowed ({msg})") from None
        if critic is not None:
            with precision(device, amp):
                stats.update(_critic_update(critic, critic_opt, batch, cfg))
        t_update = time.perf_counter() - t1
        if not params_finite(model):
            raise Diverged(step, "non-finite policy parameters after the update")
        mismatch = probe.measure(model, train.rb, batch, snap_logprobs, first=actor.first_logprobs)
        ring.push(model)
        version += 1

        # 5. Metrics.
        m = batch["mask"]
        adv = batch["advantages"][m]
        n_gen = sum(int(r.rb.response_lens.sum()) for r in rounds)
        step_time = time.perf_counter() - t0
        metrics = {
            **round_metrics(first, cfg.rollout.n_samples),
            "objective/kl": float(batch["kl"][m].mean()) if kl_on and m.any() else 0.0,
            "advantages/mean": float(adv.mean()) if adv.numel() else 0.0,
            "advantages/std": float(adv.std()) if adv.numel() > 1 else 0.0,
            "advantages/abs_max": float(adv.abs().max()) if adv.numel() else 0.0,
            "rollout/staleness": float(ring.lag if cfg.rollout.staleness else 0),
            "optim/lr": float(scheduler.get_last_lr()[0]),
            "perf/step_time": step_time,
            "perf/rollout_time": t_rollout,
            "perf/update_time": t_update,
            "perf/prox_logp_time": actor.prox_seconds,
            "perf/tokens_per_sec": n_gen / step_time if step_time > 0 else 0.0,
            **_sync_metrics(sampler),
            **stats,
            **option_metrics(cfg, first, dyn, batch),
            **mismatch,
        }
        if run.eval_due(step):
            with precision(device, amp):
                metrics.update(run.evaluate(model))
        # No optimizer step taken: every update's loss or gradient norm was non-finite.
        run.record(step, metrics, all_updates_nonfinite=stats["stability/optimizer_steps"] == 0)


def _sync_metrics(sampler: Sampler) -> dict[str, float]:
    """``perf/weight_sync_s`` of a sampler that syncs weights (the inference engine)."""
    pop = getattr(sampler, "pop_sync_seconds", None)
    return {"perf/weight_sync_s": pop()} if callable(pop) else {}


def _lr_lambda(cfg: RunConfig, total_updates: int) -> Callable[[int], float]:
    o = cfg.optim

    def f(i: int) -> float:
        if o.warmup_steps and i < o.warmup_steps:
            return (i + 1) / o.warmup_steps
        frac = min(1.0, (i - o.warmup_steps) / max(total_updates - o.warmup_steps, 1))
        if o.schedule == "linear":
            return max(0.0, 1.0 - frac)
        if o.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * frac))
        return 1.0

    return f


def _critic_update(critic, opt, batch: dict[str, Any], cfg: RunConfig) -> dict[str, float]:
    """One pass over the same token-balanced minibatches as the actor, clipped value loss."""
    m_all = batch["mask"]
    old_values = batch["values"]
    losses: list[float] = []
    bins = [
        b
        for b in minibatch_indices(
            [int(c) for c in m_all.sum(1).tolist()], cfg.ppo.ppo_n_minibatches
        )
        if b
    ]
    critic.train()
    for idx in bins:
        index = torch.tensor(idx, device=m_all.device)
        ids, att = batch["input_ids"][index], batch["attention_mask"][index]
        v = critic(ids, att)
        loss = value_loss(
            v,
            old_values[index],
            batch["returns"][index],
            m_all[index],
            value_clip=cfg.critic.value_clip,
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.optim.grad_clip or math.inf)
        opt.step()
        losses.append(float(loss.detach()))
    return {
        "critic/value_loss": sum(losses) / max(len(losses), 1),
        "critic/explained_variance": explained_variance(old_values, batch["returns"], m_all),
    }

"""One PPO training run — the one readable loop.

    for step in range(steps):
        rollout    sample prompts → the behaviour policy (k updates stale) samples n completions
        rewards    the task scores each completion                 (both: Rollouts.collect)
        advantages shape → reward_norm → KL to the reference → GAE → adv_norm   (PPOActor)
        update     ppo_epochs × ppo_n_minibatches optimizer steps               (PPOActor)
        critic     value-model update (when enabled)               (all three: Learner.update)
        push       the new weights into the staleness ring         (Policies.push)
        metrics    one dict per step, recorded by the run scaffold (step_metrics)

The pieces: ``run/policies.py`` (the live policy, the KL reference and the behaviour snapshot,
full copies or LoRA swaps behind one interface), ``run/collect.py`` (a step's rollout) and
``run/learner.py`` (optimizer, schedule, actor, critic and one update).

What every trainer shares — seeds, the warm-started model, the start eval, recording, divergence,
interruption and the summary — is the scaffold's (``harness/run/scaffold.py``); this file is the
PPO algorithm only.  The loop knows no tracker and no sweep: it reports through the scaffold's
hooks and returns a ``RunResult``.  Metric names are defined once in ``harness/metrics/__init__.py``.

The steps are a generator (:func:`ppo_stepper`) that yields after each recorded step: a run
drains it; a pack of runs sharing one base model steps several in turn (``run/packing.py``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Generator
from typing import Unpack

import torch

from harness.config import RunConfig
from harness.config.schema import INERT_CLIP_FIX, INERT_CLIP_WHY, clip_is_inert
from harness.model.build import autocast_dtype as precision_dtype
from harness.model.build import precision
from harness.run.async_rollouts import AsyncRollouts, open_rollouts
from harness.run.collect import Collected, Rollouts
from harness.run.dynamic_sampling import option_metrics, round_metrics
from harness.run.dynamic_sampling import skipped_step_metrics as _skipped
from harness.run.learner import Learner, Update
from harness.run.policies import Policies
from harness.run.sampler import make_sampler, sampler_text
from harness.run.scaffold import Hooks, Run, RunResult, execute
from harness.sampling import Sampler


def run(cfg: RunConfig, **hooks: Unpack[Hooks]) -> RunResult:
    """Train one policy with PPO as configured; never raises for a diverged run (it is returned
    with status 'diverged' and the metrics up to that step)."""
    return execute(cfg, ppo_steps, hooks)


def ppo_steps(run: Run) -> None:
    """The PPO steps on the scaffold's warm-started policy ``run.model``."""
    for _ in ppo_stepper(run):
        pass


def ppo_stepper(run: Run, sampler: Sampler | None = None) -> Generator[int, None, None]:
    """The PPO steps one at a time: yields each step's index once it is recorded; closing the
    generator (or an exception out of it) closes the sampler and the rollouts. ``sampler``:
    the rollout sampler to use instead of the run's own (a pack's view of its shared engine,
    ``run/packing.py``); it is closed with the steps all the same."""
    # One precision for recompute, reference, update and critic (models.ModelOptions); the
    # sampler's is rollout.sampler_dtype (default: the same), a mismatch source (docs/mismatch.md).
    amp = precision_dtype(run.cfg.model_options.dtype)
    # An inference engine lives as long as the run, whatever ends it.
    run.tags["sampler"] = sampler_text(run.cfg, run.model)
    if sampler is None:
        sampler = make_sampler(run.cfg, run.device, amp, run.sample_kw)
    with sampler:
        yield from _train(run, sampler, amp)


def _train(run: Run, sampler: Sampler, amp: torch.dtype | None) -> Generator[int, None, None]:
    """The step loop (:func:`_steps`) with its rollouts, closed whatever ends it (the
    asynchronous sampler's thread stops with the run)."""
    cfg = run.cfg
    policies = Policies(run.model, kl=cfg.ppo.kl_ctl > 0, staleness=cfg.rollout.staleness)
    learner = Learner(cfg, run.model, run.device, amp)
    _warn_if_clip_inert(cfg)
    rollouts = open_rollouts(run, sampler, amp)
    try:
        yield from _steps(run, sampler, policies, learner, rollouts)
    finally:
        rollouts.close()


def _steps(
    run: Run,
    sampler: Sampler,
    policies: Policies,
    learner: Learner,
    rollouts: Rollouts | AsyncRollouts,
) -> Generator[int, None, None]:
    """Collect a rollout, update, hand the new weights over, record the metrics; yield."""
    cfg, device = run.cfg, run.device

    skipped = 0  # steps whose update dynamic sampling skipped (no group left)
    synced = 0.0  # the sampler's weight-sync seconds already reported
    for step in range(cfg.steps):
        if run.stop_requested(step):
            break
        t0 = time.perf_counter()

        # 1-2. Rollout under the behaviour snapshot (`staleness` updates old), or the batch
        # the asynchronous sampler has ready (rollout.async), scored.
        col = rollouts.collect(policies, step)
        t_rollout = time.perf_counter() - t0
        run.scored(step, col.prompts)

        if col.train is None:  # every group zero-variance: nothing to learn from, no update
            skipped += 1
            run.tags["skipped_updates"] = (
                f"{skipped} step(s) without an update: every group's rewards were equal "
                "(rollout.zero_variance_filter)"
            )
            metrics = _skipped(cfg, col.first, col.dyn, t0, t_rollout)
            no_optimizer_step = False
        else:
            # 3-4. Advantages and the minibatch PPO updates (and the critic's).
            update = learner.update(policies, col.train, col.version, step)
            mismatch = rollouts.probe.measure(
                run.model,
                col.train.rb,
                update.batch,
                col.snapshot,
                first=learner.actor.first_logprobs,
            )
            policies.push()
            rollouts.updated(run.model, policies.version)
            # 5. Metrics (the weight copies since the last reported step, for a backend that
            # copies weights: perf/weight_sync_s).
            total = sampler.stats()["sync_seconds"]
            sync_s = total - synced if sampler.copies_weights else None
            synced = total
            metrics = step_metrics(
                cfg, col, update, policies, learner, sync_s, mismatch, t0=t0, t_rollout=t_rollout
            )
            metrics.update(rollouts.step_metrics())
            # No optimizer step taken: every update's loss or gradient norm was non-finite.
            no_optimizer_step = update.stats["stability/optimizer_steps"] == 0

        if run.eval_due(step):
            # eval.sampler: run = the rollout sampler, loaded with the live weights.
            on = sampler if cfg.eval.sampler == "run" else None
            with precision(device, learner.amp):
                metrics.update(run.evaluate(run.model, sampler=on, version=policies.version))
        run.record(step, metrics, all_updates_nonfinite=no_optimizer_step)
        yield step


def step_metrics(
    cfg: RunConfig,
    col: Collected,
    update: Update,
    policies: Policies,
    learner: Learner,
    sync_s: float | None,
    mismatch: dict[str, float],
    *,
    t0: float,
    t_rollout: float,
) -> dict[str, float]:
    """One updating step's metrics (names: ``harness/metrics/__init__.py``); ``t0`` is the
    step's start, so ``perf/step_time`` covers everything up to this call; ``sync_s`` the
    weight-sync seconds to report (None: the sampler copies no weights)."""
    batch = update.batch
    m = batch["mask"]
    adv = batch["advantages"][m]
    n_gen = sum(int(r.rb.response_lens.sum()) for r in col.rounds)
    step_time = time.perf_counter() - t0
    return {
        **round_metrics(col.first, cfg.rollout.n_samples),
        "objective/kl": float(batch["kl"][m].mean()) if policies.kl and m.any() else 0.0,
        "advantages/mean": float(adv.mean()) if adv.numel() else 0.0,
        "advantages/std": float(adv.std()) if adv.numel() > 1 else 0.0,
        "advantages/abs_max": float(adv.abs().max()) if adv.numel() else 0.0,
        # The lag this step's rollout sampled at (after the push, the learner is at version
        # policies.version - 1 + 1): 0 at step 0, where the only weights are the current ones.
        "rollout/staleness": float(policies.version - 1 - col.version),
        "optim/lr": learner.lr,
        "perf/step_time": step_time,
        "perf/rollout_time": t_rollout,
        "perf/update_time": update.seconds,
        "perf/prox_logp_time": learner.actor.prox_seconds,
        "perf/tokens_per_sec": n_gen / step_time if step_time > 0 else 0.0,
        **({"perf/weight_sync_s": sync_s} if sync_s is not None else {}),
        **update.stats,
        **option_metrics(cfg, col.first, col.dyn, batch),
        **mismatch,
    }


def _warn_if_clip_inert(cfg: RunConfig) -> None:
    if clip_is_inert(cfg):
        warnings.warn(
            f"clipping is inert in this configuration ({INERT_CLIP_WHY}), so eps_clip, "
            f"eps_clip_higher and c_clip cannot change the run; {INERT_CLIP_FIX}",
            UserWarning,
            stacklevel=4,  # the warning points at the trainer's call, as when it was inline
        )

"""The metric vocabulary: every per-step key the training loop logs, defined once.

Names follow what TRL / CleanRL users know (``policy/clipfrac_low``, ``policy/approx_kl``,
``objective/reward``, ``stability/grad_norm``).  ``docs/metrics.md`` is generated from this table
and the objectives' declarations (``python -m harness.ppo.objectives metrics > docs/metrics.md``)
and a test keeps the two in step.  Per-run
summaries (``final/*``, ``best/*``, ``stability/*`` over a whole run) are defined in
``harness/metrics/stability.py`` and ``docs/stability.md``.
"""

from __future__ import annotations

from harness.metrics.trl import TRL_METRICS

STEP_METRICS: dict[str, str] = {
    # objective
    "objective/reward": "Mean task reward of the step's sampled completions (before shaping/normalization).",
    "objective/reward_std": "Standard deviation of those rewards.",
    "reward/format": "Format share of objective/reward: format_weight × the mean format score (answer tag present, <think> block first when asked; task_options.format_weight); 0 for tasks without a format reward.",
    "reward/correct": "Correctness share of objective/reward: (1 − format_weight) × the mean verifier score of the extracted answers; the whole reward for tasks without a format reward. reward/format + reward/correct = objective/reward.",
    "objective/kl": "Mean per-token KL estimate (ppo.kl_estimator) of the behaviour log-probs against the frozen reference; 0 without a reference (kl_ctl = 0).",
    # evaluation
    "eval/reward": "Mean reward of greedy completions on the held-out prompts (every eval.every steps and at the end; NaN otherwise).",
    "eval/accuracy": "Fraction of held-out prompts whose greedy completion's reward is at least eval.threshold (default 1.0: answered exactly on the built-in tasks).",
    "eval/pass_at_1": "Unbiased pass@1 over eval.samples completions per held-out prompt at the rollout temperature (a completion passes with reward >= eval.threshold); only with eval.samples > 0.",
    "eval/pass_at_k": "Unbiased pass@k (k = eval.k) from the same samples: 1 − C(n−c, k)/C(n, k) per prompt, averaged (Chen et al. 2021); only with eval.samples > 0.",
    "eval/mean_at_n": "mean@n: mean reward of all eval.samples completions of all held-out prompts; only with eval.samples > 0.",
    # policy / loss statistics, token-weighted over valid tokens of all minibatch steps
    "policy/entropy": "Mean entropy of the (tempered) policy at the generated tokens.",
    "policy/approx_kl": "k3 estimate of KL(π_prox‖π_θ): mean of (r − 1) − log r, r = π_θ/π_prox (CleanRL's approx_kl).",
    "policy/approx_kl_k1": "k1 estimate: mean of log π_prox − log π_θ (CleanRL's old_approx_kl).",
    "policy/ratio_mean": "Mean policy ratio r = π_θ/π_prox over valid tokens.",
    "policy/ratio_min": "Smallest policy ratio.",
    "policy/ratio_max": "Largest policy ratio.",
    "policy/sampler_logprob_gap": "Mean abs(log π_behave − log π_θ) over the valid tokens of the step's first minibatch, before any update on the batch: how far the learner's log-probs are from the sampler's. With fresh rollouts this is numerics only: ~1e-7 in float32; under bfloat16 autocast up to ~1e-4 (per-token ratios within about 1 ± 1e-3), because the sampler's KV-cache decoding and the learner's full forward round differently. With staleness it also holds the policy lag.",
    "policy/clipfrac": "Fraction of valid tokens where the PPO clip binds (gradient zeroed): A>0 with r>1+ε_hi, or A<0 with r<1−ε.",
    "policy/clipfrac_low": "Fraction of valid tokens clipped at the lower bound (A<0, r<1−ε).",
    "policy/clipfrac_high": "Fraction of valid tokens clipped at the upper bound (A>0, r>1+ε_hi).",
    "policy/dual_clipfrac": "Fraction of valid tokens where the dual clip c·|A| binds (only possible for A<0).",
    "policy/silenced_frac": "Fraction of valid tokens whose policy gradient the objective (ppo.policy_loss) zeroed (which tokens: see the per-objective table below).",
    "policy/reweighted_frac": "Fraction of valid tokens the objective kept but re-weighted or penalised (per objective: below).",
    "policy/gate_mean": "Mean per-token gate/weight of the objective (per objective: below; only the objectives that have one).",
    "policy/cov_selected": "Tokens selected by the covariance rule per optimizer step: detached (clip_cov) or KL-penalised (kl_cov).",
    "policy/cov_candidates": "Clip-Cov: tokens per optimizer step inside the covariance band (ppo.clip_cov.cov_lb, ppo.clip_cov.cov_ub) and not already clipped, from which the selection is drawn.",
    "policy/cov_threshold": "Covariance threshold of the selection: the smallest covariance among selected tokens (KL-Cov: the top-k cut-off), mean over optimizer steps that selected any.",
    "policy/cov_penalty_kl": "KL-Cov: mean |log π_θ − log π_prox| on the penalised tokens.",
    "policy/ipo_drift": "IPO (prime-rl): mean over valid tokens of (ℓθ − ℓb)², the drift the "
    "kl_tau penalty acts on, mean over optimizer steps.",
    "policy/entropy_masked_frac": "ppo.top_entropy_quantile < 1 only: fraction of valid tokens the top-entropy mask took out of the policy loss (about 1 − ρ; ties at the threshold are kept), token-weighted over the step's minibatches.",
    "policy/loss": "Mean PPO loss over the step's optimizer steps (including the entropy bonus).",
    "policy/behave_weight_mean": "Mean behaviour importance weight w = π_prox/π_behave after capping/masking (weighting on).",
    "policy/behave_weight_min": "Smallest behaviour weight.",
    "policy/behave_weight_max": "Largest behaviour weight.",
    "policy/behave_ess": "Kish effective sample size of the behaviour weights, (Σw)²/(n·Σw²), as a fraction of tokens.",
    "policy/behave_approx_kl": "Mean log π_prox − log π_behave over tokens kept by the behaviour weight.",
    "policy/correction_masked_frac": "Fraction of valid tokens a correction (ppo.correction, rejection_sampling or behave_imp_weight_mode) took out of the loss: dropped by a filter, or given ρ = 0 by zero_outside (masked IS, IcePop). The weight ρ itself is reported as policy/behave_weight_*.",
    "policy/correction_truncated_frac": "Fraction of valid tokens the correction kept but whose weight ρ it changed by clip_min / clip_max (TIS) or a truncate filter.",
    "policy/correction_norm_factor": "What ρ was divided by: the batch mean of ρ under ppo.correction.batch_normalize (1 without it, or when that mean is ≤ 1e-8), averaged over the step's minibatches; logged whenever a correction is on.",
    "policy/filtered_fraction": "Fraction of valid tokens dropped (mask modes) or truncated (truncate/clamp modes) by the behaviour weight.",
    # training–inference mismatch (harness/metrics/mismatch.py, docs/mismatch.md): the sampler's
    # behaviour log-probs ℓb against a learner-precision forward ℓp at the current weights, over
    # the step's valid tokens, before any update; w = π_p/π_b; with rollout.measure_mismatch
    "mismatch/kl_k1": "k1 estimate of KL(π_b‖π_learner) from the sampler's tokens: mean of ℓb − ℓp (verl rollout_corr/kl; can be negative). Every mismatch/* compares the sampler's ℓb with the learner-precision ℓp at the current weights before any update on the batch, over the whole batch when the actor recomputes (ppo.recompute_logprob or use_decoupled_loss, unless prox_logp_method is loglinear), else over the update's first minibatch (the whole batch at ppo_n_minibatches 1); see docs/mismatch.md. Under staleness it holds the policy lag too (numerics_/lag_).",
    "mismatch/kl_k3": "k3 estimate of the same KL: mean of w − log w − 1, w = exp(ℓp − ℓb) (verl rollout_corr/k3_kl; ≥ 0). ≤ 1e-12 with a float32 sampler and learner; ~1e-6 to 1e-5 for a bfloat16 sampler on the tiny model.",
    "mismatch/logprob_abs_diff_mean": "Mean |ℓp − ℓb| over valid tokens (TRL sampling/sampling_logp_difference/mean).",
    "mismatch/logprob_abs_diff_max": "Largest |ℓp − ℓb| (TRL sampling/sampling_logp_difference/max).",
    "mismatch/prob_abs_diff_max": "Largest |π_p − π_b| in probability space (verl training/rollout_probs_diff_max).",
    "mismatch/log_ppl_diff": "Mean over rows of ℓ̄b − ℓ̄p, ℓ̄ = the row's mean log-prob (verl log_ppl_diff: log PPL_learner − log PPL_sampler).",
    "mismatch/ppl_ratio": "Mean over rows of exp(ℓ̄b − ℓ̄p) (verl ppl_ratio: PPL_learner / PPL_sampler per row).",
    "mismatch/chi2_token": "mean(w²) − 1 over valid tokens, log w clamped to ±20 (verl chi2_token).",
    "mismatch/chi2_seq": "Mean over rows of exp(2·Σ_t log w) − 1, the row's summed log w clamped to ±20 (verl chi2_seq).",
    "mismatch/ess": "Normalised effective sample size of the raw token weights, 1/mean(ŵ²) with ŵ = w/mean(w), in (0, 1] (verl rollout_is_eff_sample_size, before any correction).",
    "mismatch/numerics_kl_k1": "Numerics part of mismatch/kl_k1: ℓb against the learner-precision forward of the SAME weights the sampler ran (the behaviour snapshot under staleness); = kl_k1 without staleness.",
    "mismatch/numerics_kl_k3": "Numerics part, k3 estimate (sampler vs learner forward of the sampling weights).",
    "mismatch/lag_kl_k1": "Policy-lag part of mismatch/kl_k1: the snapshot's against the current weights' log-probs, both at learner precision; 0 without staleness. numerics_kl_k1 + lag_kl_k1 = kl_k1 exactly.",
    "mismatch/lag_kl_k3": "Policy-lag part, k3 estimate; numerics_kl_k3 + lag_kl_k3 ≈ kl_k3 (to second order; not exact).",
    # advantages
    "advantages/mean": "Mean advantage over valid tokens (after adv_norm).",
    "advantages/std": "Standard deviation of the advantages.",
    "advantages/abs_max": "Largest |advantage|.",
    # critic
    "critic/value_loss": "Clipped value loss of the critic update (critic on).",
    "critic/explained_variance": "1 − Var(G − V)/Var(G) of the pre-update values V against returns G.",
    # rollout
    "rollout/response_length": "Mean generated tokens per completion (EOS included).",
    "rollout/truncated_frac": "Fraction of completions that hit max_new_tokens without EOS.",
    "rollout/zero_std_groups": "Fraction of prompts whose n samples all got the same reward (no learning signal under group normalization).",
    "rollout/truncated_masked_frac": "ppo.truncated_completions: mask only: fraction of the update batch's completions (truncated, no EOS) whose tokens left the loss.",
    "reward/truncated_zeroed_frac": "ppo.truncated_completions: zero_reward only: fraction of the update batch's completions (truncated, no EOS) whose normalized reward was set to 0.",
    "reward/overlong_penalty": "ppo.overlong_reward_penalty only: mean overlong penalty min(−(|y|−(L_max−L_c))/L_c·f, 0) added to the rewards of the step's sampled completions (≤ 0; objective/reward is before it).",
    "rollout/zero_variance_dropped": "rollout.zero_variance_filter only: number of groups (prompts) dropped because all their rewards were equal, over every sampling round of the step (rollout/zero_std_groups is the fraction in the first round).",
    "rollout/resample_rounds": "rollout.zero_variance_filter only: extra sampling rounds drawn to refill the batch (at most rollout.max_resample_rounds).",
    "rollout/train_groups": "rollout.zero_variance_filter only: groups in the update batch (prompts_per_step when the refill succeeded, fewer when the rounds ran out).",
    "rollout/update_skipped": "rollout.zero_variance_filter only: 1 when no group with a learning signal was left and the step made no update (the run's skipped_updates tag counts them), else 0.",
    "rollout/staleness": "How many updates the behaviour policy lagged the current policy.",
    # asynchronous rollouts (rollout.async; docs/async.md): only logged when it is on
    "async/token_lag_mean": "Mean over the step's generated tokens of the lag: the learner's version when the step took its batch minus the version of the weights that sampled the token (0 synchronous; at most rollout.async.max_staleness without partial rollouts).",
    "async/token_lag_max": "Largest token lag of the step's batch.",
    "async/mixed_version_fraction": "Share of the batch's sequences whose tokens were sampled by two versions or more (in-flight weight updates, or partial rollouts continued under new weights).",
    "async/sampler_idle_s": "Seconds since the previous step's batch the sampler had nothing to run (waiting for the learner's weights or for admission room). Virtual clock: idle decode steps × the run's measured seconds per decode step.",
    "async/learner_idle_s": "Seconds the learner waited for this step's batch. Virtual clock: decode steps the learner was free and the batch not ready × the measured seconds per decode step.",
    # stability
    "stability/grad_norm": "Mean gradient norm before clipping over the step's optimizer steps.",
    "stability/grad_norm_max": "Largest gradient norm before clipping in the step.",
    "stability/skipped_updates": "Optimizer steps skipped in this step because the loss or gradient norm was not finite.",
    "stability/nonfinite_count": "Non-finite loss/gradient events in this step.",
    "stability/optimizer_steps": "Optimizer steps taken in this step.",
    # optimizer / performance
    "optim/lr": "Policy learning rate after this step.",
    "perf/step_time": "Wall time of the step (s).",
    "perf/rollout_time": "Wall time of sampling (s).",
    "perf/update_time": "Wall time of the PPO (and critic) updates (s).",
    "perf/prox_logp_time": "Wall time of the no-grad forward that recomputes π_prox before the update (s; part of perf/step_time); 0 when the step has none (no decoupled loss, correction or recompute_logprob, or ppo.prox_logp_method: loglinear, which interpolates π_prox instead).",
    "perf/tokens_per_sec": "Generated tokens per second of step time.",
    "perf/weight_sync_s": "Wall time of copying the policy's weights into the inference engine "
    "(s; rollout.sampler_backend vllm only, part of perf/rollout_time).",
}

_KNOWN = frozenset(STEP_METRICS)

# What each policy objective reports, declared by the objective itself (harness.ppo.objectives
# registers them on import): objective → {metric key → what it means under that objective}.
OBJECTIVE_STATS: dict[str, dict[str, str]] = {}


def declare_objective_stats(objective: str, stats: dict[str, str]) -> None:
    """Record the step metrics ``objective`` reports; every key must be in the vocabulary."""
    unknown = [k for k in stats if k not in _KNOWN]
    if unknown:
        raise KeyError(
            f"objective {objective!r} reports metrics not in harness.metrics.STEP_METRICS: "
            f"{unknown} (add them to the vocabulary)"
        )
    OBJECTIVE_STATS[objective] = dict(stats)


def forget_objective_stats(objective: str) -> None:
    OBJECTIVE_STATS.pop(objective, None)


# Logged only under the ppo.policy_loss objectives that define them.
OBJECTIVE_METRICS = frozenset(
    {
        "policy/gate_mean",
        "policy/cov_selected",
        "policy/cov_candidates",
        "policy/cov_threshold",
        "policy/cov_penalty_kl",
        "policy/ipo_drift",
    }
)


# Logged only while the stability option that defines them is on (docs/ppo-semantics.md
# "Stability options"): an arm with the option off has no such series.
OPTION_METRICS = frozenset(
    {
        "policy/entropy_masked_frac",
        "rollout/truncated_masked_frac",
        "reward/truncated_zeroed_frac",
        "reward/overlong_penalty",
        "rollout/zero_variance_dropped",
        "rollout/resample_rounds",
        "rollout/train_groups",
        "rollout/update_skipped",
        "perf/weight_sync_s",  # only with rollout.sampler_backend: vllm
    }
)


# Logged only by asynchronous runs (rollout.async): tests/run/test_async.py asserts them.
ASYNC_METRICS = frozenset(k for k in STEP_METRICS if k.startswith("async/"))


def check_names(metrics: dict[str, float]) -> None:
    """Guard against a key that is not in the vocabulary (a typo would silently fork a metric)."""
    unknown = [k for k in metrics if k not in _KNOWN]
    if unknown:
        raise KeyError(f"metric names not in harness.metrics.STEP_METRICS: {unknown}")


def markdown() -> str:
    lines = [
        "# Metrics",
        "",
        "Every per-step metric the training loop logs (generated from `harness/metrics/__init__.py` "
        "and the objectives' declarations in `harness/ppo/objectives/`; regenerate with "
        "`python -m harness.ppo.objectives metrics > docs/metrics.md`).  Per-run summaries "
        "(`final/*`, `best/*`, run-level `stability/*`) are defined in [stability.md](stability.md).",
        "",
        "| key | definition |",
        "|---|---|",
    ]
    lines += [f"| `{k}` | {v} |" for k, v in STEP_METRICS.items()]
    lines += _objective_section()
    lines += _trl_section()
    return "\n".join(lines) + "\n"


def _objective_section() -> list[str]:
    """What each registered objective's statistics mean under it (``OBJECTIVE_STATS``)."""
    lines = [
        "",
        "## Per objective (`ppo.policy_loss`)",
        "",
        "What the objective statistics mean under each objective (declared by the objective's "
        "module in `harness/ppo/objectives/`); a key an objective does not list is not logged "
        "under it.",
        "",
        "| objective | key | meaning |",
        "|---|---|---|",
    ]
    for name, stats in OBJECTIVE_STATS.items():
        lines += [f"| `{name}` | `{k}` | {v} |" for k, v in stats.items()]
    return lines


def _trl_section() -> list[str]:
    """How ``trainer: trl`` fills the same keys from TRL's logs (data in ``metrics.trl.TRL_METRICS``)."""
    how = {
        "mean": "mean over the step's optimizer steps",
        "last": "last optimizer step",
        "max": "largest over the step's optimizer steps",
        "min": "smallest over the step's optimizer steps",
    }
    lines = [
        "",
        "## `trainer: trl`",
        "",
        "A TRL run logs the same keys, once per harness step (one generation cycle of "
        "`ppo_n_minibatches × ppo_epochs` optimizer steps). From TRL's own logs:",
        "",
        "| TRL `GRPOTrainer` log key | harness key | combined as |",
        "|---|---|---|",
    ]
    lines += [f"| `{t}` | `{k}` | {how.get(c, c)} |" for t, (k, c) in TRL_METRICS.items()]
    lines += [
        "",
        "Computed by the harness where TRL computes them (its reward function and "
        "`_generate_and_score_completions`): `objective/reward`, `objective/reward_std`, "
        "`rollout/zero_std_groups` (raw task scores), `advantages/*` (token-weighted over the "
        "completion mask), `perf/*`, `stability/grad_norm_max`, `stability/optimizer_steps`, "
        "`stability/nonfinite_count`, `eval/*` (the same greedy evaluation). `objective/kl` and "
        "`rollout/staleness` are 0 (TRL runs have no reference in the reward and no lag); "
        "`stability/skipped_updates` is 0 (HF's Trainer steps even on a non-finite loss). Not "
        "logged by TRL, so absent: `policy/approx_kl*`, `policy/ratio_*`, `policy/dual_clipfrac`, "
        "`policy/sampler_logprob_gap`, `policy/behave_*`, `mismatch/*`, `critic/*`, "
        "`perf/prox_logp_time`, `reward/format`, "
        "`reward/correct` (its reward function returns the total).",
    ]
    return lines

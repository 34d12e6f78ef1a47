"""Which ``trainer: trl`` log key fills which harness metric, and how a cycle of logs combines."""

from __future__ import annotations

# TRL's per-optimizer-step log key → (harness key, how one step's cycle of logs combines).
# Keys TRL does not log (policy/approx_kl, ratio stats, ...) stay absent (NaN) for TRL runs.
TRL_METRICS: dict[str, tuple[str, str]] = {
    "entropy": ("policy/entropy", "mean"),
    "clip_ratio/low_mean": ("policy/clipfrac_low", "mean"),
    "clip_ratio/high_mean": ("policy/clipfrac_high", "mean"),
    "clip_ratio/region_mean": ("policy/clipfrac", "mean"),
    "cispo_clip_ratio": ("policy/clipfrac_high", "mean"),
    "loss": ("policy/loss", "mean"),  # HF's training loss: the policy loss (+ entropy term)
    "grad_norm": ("stability/grad_norm", "mean"),
    "learning_rate": ("optim/lr", "last"),
    "completions/mean_length": ("rollout/response_length", "mean"),
    "completions/clipped_ratio": ("rollout/truncated_frac", "mean"),
    # With the engine (rollout.sampler_backend: vllm) and an IS correction, TRL logs the
    # engine-vs-learner gap and its behaviour weight ρ once per generation.
    "sampling/sampling_logp_difference/mean": ("mismatch/logprob_abs_diff_mean", "mean"),
    "sampling/sampling_logp_difference/max": ("mismatch/logprob_abs_diff_max", "max"),
    "sampling/importance_sampling_ratio/mean": ("policy/behave_weight_mean", "mean"),
    "sampling/importance_sampling_ratio/min": ("policy/behave_weight_min", "min"),
    "sampling/importance_sampling_ratio/max": ("policy/behave_weight_max", "max"),
}

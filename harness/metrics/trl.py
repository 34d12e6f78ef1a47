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
}

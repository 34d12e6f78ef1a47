"""Evaluate a ``Correction`` on [B, T] tensors: the narrowed loss mask and the weight ρ.

Pure tensor math, no gradient (every input is detached).  The one implementation behind
``ppo.correction``, ``ppo.rejection_sampling`` and ``ppo.behave_imp_weight_mode`` (the latter two
are translated by ``harness.ppo.corrections.areal``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.ppo.corrections.spec import Correction, Filter


@dataclass
class CorrectionResult:
    """``mask`` the loss mask after the filters (the caller's, when ``narrow_mask`` is false),
    ``w`` ρ (0 off ``mask`` and on dropped tokens; None for weight 'none'), and per valid token:
    ``masked`` dropped by a filter or zeroed by ``zero_outside``, ``truncated`` kept with ρ
    changed by clipping or a truncate filter; ``norm_factor`` what ρ was divided by (1 without
    ``batch_normalize``)."""

    mask: torch.Tensor
    w: torch.Tensor | None
    masked: torch.Tensor
    truncated: torch.Tensor
    norm_factor: float = 1.0

    def fractions(self, valid: torch.Tensor) -> tuple[float, float]:
        n = max(int(valid.sum()), 1)
        return float(self.masked.sum()) / n, float(self.truncated.sum()) / n


def _zeros_like(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """The inputs' own precision, never below float32: bf16/fp16 log-probs are widened to
    float32 (as AReaL computes its behaviour weights), float64 ones stay float64 (narrowing them
    would put a ~1e-7 relative error on ρ that no peer has)."""
    return x.detach().to(torch.promote_types(x.dtype, torch.float32))


def log_weight(ref: torch.Tensor, behave: torch.Tensor) -> torch.Tensor:
    """log w = ℓr − ℓb, non-finite → 0 (w = 1: TRL's nan_to_num, AReaL's isfinite guard)."""
    d = _wide(ref) - _wide(behave)
    return torch.where(torch.isfinite(d), d, _zeros_like(d))


def row_sum(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return torch.where(m, x, _zeros_like(x)).sum(dim=1, keepdim=True)


def row_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Mean over the row's valid tokens, divisor max(n, 1) (an empty row gives 0)."""
    return row_sum(x, m) / m.sum(dim=1, keepdim=True).clamp(min=1)


def row_extreme(x: torch.Tensor, m: torch.Tensor, which: str) -> torch.Tensor:
    """Max (or min) over the row's valid tokens; an empty row gives 0 (verl's seq_max)."""
    fill = torch.full((), -math.inf if which == "max" else math.inf, dtype=x.dtype)
    masked = torch.where(m, x, fill)
    v = masked.max(dim=1, keepdim=True).values if which == "max" else masked.min(1, True).values
    return torch.where(m.any(dim=1, keepdim=True), v, torch.zeros_like(v))


def segment_ids(m: torch.Tensor) -> torch.Tensor:
    """[B, T] long: 1, 2, … for the maximal runs of consecutive valid tokens of each row, in
    order; 0 off the mask.  A row whose valid tokens are contiguous (one completion) is one
    segment; a multi-turn row, with the other side's tokens masked out, has one per turn."""
    prev = torch.nn.functional.pad(m[:, :-1], (1, 0), value=False)
    starts = m & ~prev
    return torch.where(m, starts.long().cumsum(dim=1), torch.zeros((), dtype=torch.long))


def segment_reduce(x: torch.Tensor, m: torch.Tensor, agg: str) -> torch.Tensor:
    """The ``agg`` (sum, mean, max or min) of ``x`` over each segment of ``segment_ids(m)``,
    broadcast to the segment's tokens; 0 off the mask:

        out_t = agg_{s ∈ S(t)} x_s,   S(t) = the run of consecutive valid tokens holding t

    ROLL (alibaba/ROLL) ``roll/pipeline/agentic/utils.py`` ``compute_segment_masked_mean`` (the
    mean, a Python loop over the runs, divisor count + 1e-8), used by
    ``roll/utils/train_infer_corrections.py`` ``_compute_all_granularity`` for the 'segment'
    granularity of its train–infer filters: ratio = exp(segment mean of ℓold − ℓinfer),
    diff = segment mean of p_old − p_infer.  Here the divisor is the exact count: ROLL adds its
    1e-8 to an int64 count, which torch forms in float32, where it rounds away."""
    B, T = m.shape
    ids = segment_ids(m)
    k = T + 1  # segment ids per row: 0 (off the mask) … at most ⌈T/2⌉
    flat = (ids + torch.arange(B, device=m.device)[:, None] * k).reshape(-1)
    size = B * k
    if agg in ("sum", "mean"):
        vals = torch.where(m, x, _zeros_like(x)).reshape(-1)
        tot = torch.zeros(size, dtype=x.dtype, device=x.device).index_add_(0, flat, vals)
        if agg == "mean":
            n = torch.zeros(size, dtype=x.dtype, device=x.device)
            n = n.index_add_(0, flat, m.to(x.dtype).reshape(-1))
            tot = tot / n.clamp(min=1)
    else:
        fill = -math.inf if agg == "max" else math.inf
        vals = torch.where(m, x, torch.full((), fill, dtype=x.dtype)).reshape(-1)
        tot = torch.full((size,), fill, dtype=x.dtype, device=x.device).scatter_reduce_(
            0, flat, vals, reduce="amax" if agg == "max" else "amin"
        )
    return torch.where(m, tot[flat].reshape(B, T), _zeros_like(x))


def token_metric(
    f: Filter, lw: torch.Tensor, ref: torch.Tensor, behave: torch.Tensor
) -> torch.Tensor:
    """The filter's per-token statistic (for 'ratio': log w, exponentiated after aggregation)."""
    if f.metric == "ratio":
        return lw
    log_u = lw if f.direction == "behave_ref" else -lw  # u = w, or 1/w
    if f.metric == "k1":
        return -log_u
    if f.metric == "k2":
        return 0.5 * lw * lw
    if f.metric == "k3":
        return torch.exp(log_u) - 1 - log_u
    if f.metric in ("tv", "prob_diff", "binary_kl_directed"):
        return probability_statistic(f.metric, ref, behave, f.direction)
    # binary_kl: the larger of the two Bernoulli KLs of the sampled token's probability.
    p = _wide(ref).exp().clamp(1e-8, 1 - 1e-8)
    q = _wide(behave).exp().clamp(1e-8, 1 - 1e-8)

    def bkl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * (a / b).log() + (1 - a) * ((1 - a) / (1 - b)).log()

    return torch.maximum(bkl(p, q), bkl(q, p))


OPENRLHF_PROB_CLAMP = 1e-6


def probability_statistic(
    metric: str, ref: torch.Tensor, behave: torch.Tensor, direction: str = "behave_ref"
) -> torch.Tensor:
    """Per-token statistics of the sampled token's probabilities p_r = exp(ℓr), p_b = exp(ℓb):

        prob_diff            d = p_r − p_b                      (no clamp)
        tv                   |p̃_r − p̃_b|
        binary_kl_directed   p̃_b·log(p̃_b/p̃_r) + (1 − p̃_b)·log((1 − p̃_b)/(1 − p̃_r))
                             = KL(Bern(p̃_b) ‖ Bern(p̃_r))  (direction behave_ref; ref_behave
                             swaps the two)

    with p̃ = clamp(p, 1e-6, 1 − 1e-6).

    Sources: OpenRLHF ``openrlhf/models/loss.py`` (``PolicyLoss.forward``,
    ``is_correction_gating`` ``binary_kl`` / ``tv``: p = rollout, q = old probabilities, both
    clamped to [1e-6, 1 − 1e-6], stat = p·log(p/q) + (1 − p)·log((1 − p)/(1 − q)) or |p − q|);
    ROLL ``roll/utils/train_infer_corrections.py`` (``_compute_all_granularity``: ``diff_token =
    old_log_probs.exp() − infer_log_probs.exp()``, unclamped, gated by
    ``train_infer_correction.filters[].diff_low/diff_high``).
    """
    p_r = _wide(ref).exp()
    p_b = _wide(behave).exp()
    if metric == "prob_diff":
        return p_r - p_b
    lo, hi = OPENRLHF_PROB_CLAMP, 1 - OPENRLHF_PROB_CLAMP
    p_r, p_b = p_r.clamp(lo, hi), p_b.clamp(lo, hi)
    if metric == "tv":
        return (p_r - p_b).abs()
    a, b = (p_b, p_r) if direction == "behave_ref" else (p_r, p_b)
    return a * (a / b).log() + (1 - a) * ((1 - a) / (1 - b)).log()


def filter_statistic(
    f: Filter, m: torch.Tensor, lw: torch.Tensor, ref: torch.Tensor, behave: torch.Tensor
) -> torch.Tensor:
    """[B, T] (token and segment level) or [B, 1] (sequence level) statistic the bounds apply
    to."""
    x = token_metric(f, lw, ref, behave)
    if f.level == "segment":
        x = segment_reduce(x, m, f.agg)
    elif f.level == "sequence":
        if f.agg == "sum":
            x = row_sum(x, m)
        elif f.agg == "mean":
            x = row_mean(x, m)
        else:
            x = row_extreme(x, m, f.agg)
    return torch.exp(x) if f.metric == "ratio" else x


def inside(x: torch.Tensor, lower: float | None, upper: float | None) -> torch.Tensor:
    ok = torch.ones_like(x, dtype=torch.bool)
    if upper is not None:
        ok = ok & (x <= upper)
    if lower is not None:
        ok = ok & (x >= lower)
    return ok


def sequence_weight(
    kind: str, lw: torch.Tensor, m: torch.Tensor, log_clamp: float | None
) -> torch.Tensor:
    """ρ before clipping: per token, or a row's product / geometric mean broadcast to [B, T]."""
    if kind == "token":
        s = lw
    elif kind == "sequence_product":
        s = row_sum(lw, m).expand_as(lw)
    else:
        s = row_mean(lw, m).expand_as(lw)
    if log_clamp is not None:
        s = s.clamp(-log_clamp, log_clamp)
    return torch.exp(s)


def apply_correction(
    c: Correction,
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
) -> CorrectionResult:
    """The correction of one loss call (a micro-batch): filters in order, then ρ.

    For each filter (reference ℓr = ℓp, or sg(ℓθ) under ``reference: current`` / ``bypass``):
    keep ⟸ lower ≤ stat ≤ upper, or A ≥ 0 with ``negative_advantage_only``; ``mask`` filters AND
    into the keep mask, ``truncate`` filters clip ρ where they fail.  ρ = the weight of log w
    (± ``log_clamp``), then truncated to [clip_min, clip_max] or zeroed outside it, then divided
    by its batch mean; finally 0 on every dropped token.
    """
    m = loss_mask.bool()
    behave = old_logprobs.detach()
    current = logprobs.detach()
    prox = proximal_logprobs.detach()

    def ref_of(which: str) -> torch.Tensor:
        return current if c.bypass or which == "current" else prox

    adv = _wide(advantages)
    keep = torch.ones_like(m)
    truncations: list[tuple[torch.Tensor, Filter]] = []
    for f in c.filters:
        ref = ref_of(f.reference)
        seen = m & keep if c.sequential else m
        stat = filter_statistic(f, seen, log_weight(ref, behave), ref, behave)
        ok = inside(stat, f.lower, f.upper)
        if f.negative_advantage_only:
            if f.level == "token":
                a = adv
            elif f.level == "segment":  # the sign of the run's mean advantage
                a = segment_reduce(adv, seen, "mean")
            else:
                a = row_mean(adv, m)
            ok = ok | ~(a < 0)
        ok = ok.expand_as(m)
        if f.action == "mask":
            keep = keep & ok
        else:
            truncations.append((~ok, f))
    kept = m & keep
    zeroed = torch.zeros_like(m)
    truncated = torch.zeros_like(m)
    w: torch.Tensor | None = None
    norm_factor = 1.0
    if c.weight != "none":
        ref = ref_of("proximal")
        lw = log_weight(ref, behave)
        w_mask = kept if c.sequential else m
        w = sequence_weight(c.weight, lw, w_mask, c.log_clamp)
        raw = w
        lo, hi = c.clip_min, c.clip_max
        if c.zero_outside:
            zeroed = m & ~inside(w, lo, hi)
            w = torch.where(zeroed, _zeros_like(w), w)
        elif lo is not None or hi is not None:
            w = w.clamp(min=lo, max=hi)
        for fails, f in truncations:
            w = torch.where(fails, w.clamp(min=f.lower or 0.0, max=f.upper), w)
        truncated = kept & ~zeroed & (w != raw)
        if c.batch_normalize:
            w, norm_factor = _batch_normalize(w, m, per_row=c.weight != "token", bypass=c.bypass)
        w = torch.where(kept, w, _zeros_like(w))
    masked = (m & ~keep) | zeroed
    return CorrectionResult(
        mask=kept if c.narrow_mask else m,
        w=w,
        masked=masked,
        truncated=truncated,
        norm_factor=norm_factor,
    )


VERL_MEAN_EPS = 1e-8


def _batch_normalize(
    w: torch.Tensor, m: torch.Tensor, *, per_row: bool, bypass: bool = False
) -> tuple[torch.Tensor, float]:
    """(ρ / ρ̄, ρ̄): verl's ``rollout_is_batch_normalize``, its epsilons included (ε = 1e-8,
    added in ρ's precision):

        token weights     ρ̄ = Σ M·ρ / (Σ M + ε)        (decoupled: weights made on the driver)
                          ρ̄ = Σ M·ρ / Σ M              (bypass: made in the loss, under
                                                        torch.distributed)
        sequence weights  ρ̄_i = Σ_t M_i·ρ_i / (n_i + ε),   ρ̄ = Σ_i [n_i > 0]·ρ̄_i / #{i: n_i > 0}

    ρ is divided only when ρ̄ > 1e-8 (else unchanged, divisor 1).

    verl-project/verl ``verl/trainer/ppo/rollout_corr_helper.py`` at
    be3e5054f4ad962743a1308b608228126fb10b02, ``compute_rollout_correction_weights``, with
    ``verl/utils/torch_functional.py`` at f6ea48d1900bcb86ca38dec38ae82b36b3468ec3:
    ``masked_mean`` = Σ/(n + 1e-8) (the token mean without a process group, and every row's
    mean), ``distributed_masked_mean`` = all-reduced Σ/n (the token and row means under a
    process group, as in bypass mode's loss); the rows' mean without one divides by
    ``seq_mask.sum().clamp_min(1e-8)``, the exact count.  verl's trainer passes its int64
    attention mask, so there n + 1e-8 is formed in float32 and rounds to n; the harness keeps
    the formula as written, ε in ρ's precision (apart by at most 1e-8/n relative).
    """
    dt = w.dtype
    mf = m.to(dt)
    if per_row:
        per = torch.where(m, w, _zeros_like(w)).sum(dim=1) / (mf.sum(dim=1) + VERL_MEAN_EPS)
        rows = (mf.sum(dim=1) > 0).to(dt)
        mean = (per * rows).sum() / rows.sum().clamp(min=VERL_MEAN_EPS)
    else:
        total = torch.where(m, w, _zeros_like(w)).sum()
        n = mf.sum()
        mean = total / n if bypass else total / (n + VERL_MEAN_EPS)
    # A NaN mean (bypass, no valid token: 0/0) fails the test too, as in verl.
    if not bool(mean > VERL_MEAN_EPS):
        return w, 1.0
    return w / mean, float(mean)

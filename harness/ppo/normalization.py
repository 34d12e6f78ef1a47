"""Advantage / reward normalization: AReaL's ``NormConfig`` and ``Normalization`` as pure functions.

Source: AReaL ``areal/api/cli_args.py`` (``NormConfig``) and ``areal/utils/data.py``
(``Normalization.__call__``, ``_compute_mean``, ``_compute_std``), main branch semantics;
``docs/ppo-semantics.md`` "Normalization" (its golden values are in tests/ppo/test_ppo_golden.py).

A *scope* is the whole batch, or one group of consecutive rows (``group_sizes``, else fixed slices
of ``group_size`` rows).  Within a scope, with validity mask M (all ones without a mask):

    S = Σ M·x,  n = Σ M
    mean          μ = S / n                                 (μ = 0 when n = 0)
    leave-1-out   μ_j = (S − x_j) / max(n − M_j, 1) for valid j, S / n for invalid j;
                  μ ≡ 0 when n ≤ 1 (batch scope, or a group of several rows with ≤ 1 valid entry)
    singleton     a group of ONE ROW with leave-one-out has no peer: μ = x, so the output is 0
                  (main; v1.0.4 used μ = 0 and let the raw value through).  "One row" counts rows,
                  not valid entries, so a one-row group of T tokens is also all 0.
    None          μ = 0
    centred       c = (x − μ)·M
    std           σ = sqrt(Σ c² / (n − 1))  unbiased; σ = 1 when n ≤ 1, and σ = 1 for a one-row
                                            group whatever its number of tokens
                  σ = sqrt(Σ c² / n)        biased;   σ = 1 when n = 0 (so a singleton gets
                                            σ = |x − μ|: 0 when μ = x, and 0/(0 + eps) = 0)
                  None: σ = 1 and eps = 0
    output        y = c / (σ + eps), float32  (eps is added to the std, not the variance)

So with both levels None the output is x·M: masked entries are 0 like everywhere else, valid ones
pass through.  If Σ M = 0 over the whole batch, x is returned unchanged.  The std is taken about
whatever μ the mean level produced (so "group mean, batch std", LitePPO, pools deviations from the
group means over the batch; leave-one-out pools deviations from the per-element means:
docs/ppo-semantics.md "Q6: leave-one-out std pools per-element deviations").
With eps = 0 a zero-variance scope gives 0/0 = NaN, exactly as in AReaL (the default eps avoids it).

Deviations from AReaL main, on purpose (each has a test in tests/ppo/test_ppo_golden.py):

* Masked-out entries are *selected away* (``torch.where``), never multiplied by 0, so a NaN or inf
  in a padding slot cannot poison the statistics (AReaL multiplies by the mask, so it can:
  areal-project/AReaL#1347).  Identical for finite input.
* A fixed ``group_size`` that does not divide the batch raises ``ValueError`` instead of silently
  dividing the leftover rows by ``eps`` (docs/ppo-semantics.md "Q4: group size that does not
  divide the batch": ``[1, 3, 5]`` with groups of 2 gives
  ``500000.0`` for the last entry there).
* Every statistic stays in float64 until the final cast.  AReaL writes group-level μ and σ into a
  buffer of x's dtype and centres in that dtype (float32 for float32 input), while batch-level
  ones stay float64; the difference is float32 rounding (≤ 1e-6 relative).
* The mask is read as boolean; AReaL also accepts fractional mask weights.
* No ``torch.distributed`` all-reduce of the batch statistics: the harness trains in one process
  per run.

``group_sizes`` wins over ``group_size``, as in AReaL main: when both are given and disagree, the
slices come from ``group_sizes`` and ``group_size`` is ignored.  Because a newcomer may expect fixed
slices, the first disagreement in a process emits one ``UserWarning``; the numbers are AReaL's.

Group-level centering with singleton groups and no leave-one-out sets every output to 0; this
emits a ``UserWarning`` (main warns in ``PPOActorConfig`` for reward_norm with group_size 1).

``divide_by="mean"`` is MaxRL's mean normalization (Tajwar et al., arXiv 2602.02710), which AReaL
does not have: the centred value is divided by the scope's own mean instead of a std,
y = (x − μ)/(μ + eps), and a scope whose mean is ≤ 0 gives 0 (:func:`divide_by_mean`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import torch

from harness.core.configtools import checked
from harness.core.fields import option

Level = Literal["batch", "group"] | None


@dataclass(frozen=True)
@checked()
class NormConfig:
    """How to normalize a tensor of rewards (one per sequence) or advantages (one per token).

    Field names, order and defaults are AReaL's ``NormConfig``.
    """

    mean_level: Level = option(
        "batch",
        "Where the mean is taken: 'batch', 'group' (the n samples of a prompt) or None (no centering).",
    )
    mean_leave1out: bool = option(
        False,
        "Leave-one-out mean (RLOO): each entry is centred by the mean of the others in its scope.",
    )
    std_level: Level = option(
        "batch", "Where the std is taken: 'batch', 'group' or None (no scaling)."
    )
    std_unbiased: bool = option(True, "Bessel-corrected (n-1) standard deviation.")
    eps: float = option(1e-5, "Added to the std (not the variance).", ge=0)
    group_size: int = option(
        1,
        "Rows per group when no explicit group sizes are passed (the training loop "
        "passes the real per-prompt sizes); 1 = the batch's, any other value must agree "
        "with them.",
        ge=1,
        le=10_000,
    )
    divide_by: Literal["std", "mean"] = option(
        "std",
        "What the centred value is divided by: 'std' (std_level's σ, AReaL) or "
        "'mean' (MaxRL, prime-rl max_rl / SkyRL maxrl: (x − μ)/(μ + eps) with μ the "
        "mean_level scope's mean; a scope with μ ≤ 0 gives 0; needs std_level null and "
        "no leave-one-out). eps 0 is prime-rl's, 1e-6 SkyRL's.",
    )

    def __post_init__(self) -> None:
        # Each field is checked from its declaration (``checked``); the rest ties fields.
        if self.divide_by == "mean":
            # The divisor is the mean of the centring scope: without centring there is none, a
            # leave-one-out mean is a different number per entry, and a std would be a second
            # divisor that the formula has no place for.
            if self.mean_level is None:
                raise ValueError("divide_by 'mean' needs mean_level 'group' or 'batch'; got None")
            if self.mean_leave1out:
                raise ValueError(
                    "divide_by 'mean' needs mean_leave1out false (MaxRL divides by "
                    "the plain scope mean)"
                )
            if self.std_level is not None:
                raise ValueError(
                    f"divide_by 'mean' replaces the std: set std_level null (got "
                    f"{self.std_level!r})"
                )

    @property
    def uses_groups(self) -> bool:
        return "group" in (self.mean_level, self.std_level)


_warned_group_size = False


def _warn_group_size_ignored(group_size: int, sizes: list[int]) -> None:
    """Say once per process that explicit ``group_sizes`` override ``cfg.group_size``."""
    global _warned_group_size
    if _warned_group_size:
        return
    _warned_group_size = True
    shown = f"{sizes[:8]}{' ...' if len(sizes) > 8 else ''}"
    warnings.warn(
        f"group_size {group_size} differs from the batch's group_sizes {shown}; the groups come "
        "from group_sizes and group_size is ignored (as in AReaL); this is said once",
        UserWarning,
        stacklevel=4,
    )


def _group_ids(
    batch: int, cfg: NormConfig, group_sizes: list[int] | torch.Tensor | None
) -> torch.Tensor:
    """Row → group index for consecutive-row groups."""
    if group_sizes is not None:
        sizes = [
            int(s)
            for s in (
                group_sizes.tolist() if isinstance(group_sizes, torch.Tensor) else group_sizes
            )
        ]
        if any(s <= 0 for s in sizes):
            raise ValueError(f"group_sizes must all be > 0; got {sizes}")
        if sum(sizes) != batch:
            raise ValueError(f"group_sizes sum to {sum(sizes)} but the batch has {batch} rows")
        # AReaL main: the batch's own groups win and the setting is ignored. They disagree
        # routinely (dynamic filtering, partial groups, code that sets group_size = n_samples),
        # so this is not an error; a reader who expected fixed slices is told once.
        if cfg.group_size != 1 and any(s != cfg.group_size for s in sizes):
            _warn_group_size_ignored(cfg.group_size, sizes)
    else:
        if batch % cfg.group_size != 0:
            raise ValueError(
                f"group_size {cfg.group_size} does not divide the batch of {batch} rows; "
                "pass group_sizes or choose a group_size that divides the batch"
            )
        sizes = [cfg.group_size] * (batch // cfg.group_size)
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


def _scope_sum(v: torch.Tensor, gid: torch.Tensor | None, n_groups: int) -> torch.Tensor:
    """Sum of v over its scope, broadcast back to v's shape. gid=None means the whole batch."""
    if gid is None:
        return v.sum().expand_as(v)
    per_row = v.reshape(v.shape[0], -1).sum(dim=1)
    per_group = torch.zeros(n_groups, dtype=v.dtype).index_add_(0, gid, per_row)
    return per_group[gid].reshape((-1,) + (1,) * (v.dim() - 1)).expand_as(v)


def normalize(
    x: torch.Tensor,
    cfg: NormConfig,
    loss_mask: torch.Tensor | None = None,
    group_sizes: list[int] | torch.Tensor | None = None,
) -> torch.Tensor:
    """Normalize ``x`` ([B] or [B, T]) with ``cfg``; groups are consecutive rows.

    Args:
        x: rewards [B] or token advantages [B, T].
        cfg: the normalization options.
        loss_mask: optional validity mask with x's shape; invalid entries are ignored by the
            statistics and come out as exactly 0.  When the mask has no valid entry, x is returned
            unchanged (as float32).
        group_sizes: consecutive group row counts (sum = B), the real per-prompt groups.  When
            given they win: ``cfg.group_size`` is ignored, as in AReaL main (the first
            disagreement in a process warns once).  Without it, fixed slices of
            ``cfg.group_size`` rows, which must divide B.

    Returns: float32 tensor shaped like x.
    """
    if loss_mask is not None and loss_mask.shape != x.shape:
        raise ValueError(f"loss_mask shape {tuple(loss_mask.shape)} != x shape {tuple(x.shape)}")
    if x.dim() == 0:
        raise ValueError("normalize needs at least one dimension (rows)")
    if cfg.mean_level is None and cfg.std_level is None and loss_mask is None:
        return x.to(torch.float32).clone()

    valid = torch.ones_like(x, dtype=torch.bool) if loss_mask is None else loss_mask.bool()
    if loss_mask is not None and not bool(valid.any()):
        return x.to(torch.float32).clone()
    m = valid.to(torch.float64)
    xv = torch.where(valid, x.to(torch.float64), torch.zeros((), dtype=torch.float64))

    gid: torch.Tensor | None = None
    n_groups = 0
    one_row = torch.zeros_like(valid)  # entries of a group that has exactly one row
    if cfg.uses_groups:
        gid = _group_ids(x.shape[0], cfg, group_sizes)
        n_groups = int(gid.max()) + 1 if gid.numel() else 0
        rows = torch.bincount(gid, minlength=n_groups)
        one_row = (rows[gid] == 1).reshape((-1,) + (1,) * (x.dim() - 1)).expand_as(valid)

    # ---- mean ----
    mean_scope = gid if cfg.mean_level == "group" else None
    if cfg.mean_level is None:
        mu = torch.zeros_like(xv)
    else:
        s = _scope_sum(xv, mean_scope, n_groups)
        n = _scope_sum(m, mean_scope, n_groups)
        plain = torch.where(n > 0, s / n.clamp(min=1), torch.zeros((), dtype=torch.float64))
        if not cfg.mean_leave1out:
            mu = plain
            if cfg.mean_level == "group" and bool((n <= 1).all()):
                warnings.warn(
                    "group-level mean over singleton groups without leave-one-out sets every "
                    "normalized value to 0 (the signal is erased); use larger groups, "
                    "mean_leave1out, or mean_level='batch'",
                    UserWarning,
                    stacklevel=2,
                )
        else:
            loo = torch.where(valid, (s - xv) / (n - m).clamp(min=1), plain)
            # A scope with at most one valid entry has nobody to leave out: AReaL centres it by 0.
            mu = torch.where(n > 1, loo, torch.zeros((), dtype=torch.float64))
            if cfg.mean_level == "group":
                # ...except a one-row group, which main centres by itself (output 0), by row count.
                mu = torch.where(one_row, xv, mu)

    centred = torch.where(valid, xv - mu, torch.zeros((), dtype=torch.float64))
    if cfg.divide_by == "mean":
        out = divide_by_mean(centred, mu, float(cfg.eps))
        return torch.where(valid, out, torch.zeros((), dtype=torch.float64)).to(torch.float32)

    # ---- std ----
    eps = float(cfg.eps)
    if cfg.std_level is None:
        sigma = torch.ones_like(xv)
        eps = 0.0
    else:
        std_scope = gid if cfg.std_level == "group" else None
        ss = _scope_sum(centred * centred, std_scope, n_groups)
        n = _scope_sum(m, std_scope, n_groups)
        if cfg.std_unbiased:
            sigma = torch.where(n > 1, torch.sqrt(ss / (n - 1).clamp(min=1)), torch.ones_like(ss))
            if cfg.std_level == "group":  # a one-row group gets σ = 1 whatever its token count
                sigma = torch.where(one_row, torch.ones_like(sigma), sigma)
        else:
            sigma = torch.where(n > 0, torch.sqrt(ss / n.clamp(min=1)), torch.ones_like(ss))

    out = centred / (sigma + eps)
    out = torch.where(valid, out, torch.zeros((), dtype=torch.float64))
    return out.to(torch.float32)


def divide_by_mean(centred: torch.Tensor, mu: torch.Tensor, eps: float) -> torch.Tensor:
    """MaxRL's mean normalization of centred rewards (Tajwar et al., arXiv 2602.02710, the
    p-normalized advantage that makes the group estimator unbiased for the truncated
    maximum-likelihood objective):

        A = (r − μ) / (μ + eps)   where μ > 0,      A = 0   where μ ≤ 0

    with μ the scope (group) mean and ``centred`` = r − μ.  With binary rewards and K of N
    correct, a correct sample gets (N − K)/K and a wrong one −1: rarely solved prompts weigh ~1/p.

    Peers (float64 here; both compute in float32):

    * prime-rl ``src/prime_rl/orchestrator/algo/max_rl.py`` (``MaxRLAlgorithm.score_group``):
      (r − μ)/μ, no epsilon; a group with μ ≤ 0 gets 0.  A one-sample group: (r − r)/r = 0.
    * SkyRL ``skyrl/backends/skyrl_train/utils/ppo_utils.py`` (``compute_maxrl_advantage``):
      (r − μ)/(μ + 1e-6) with no guard, so a negative group mean flips the sign of every
      advantage in the group (and μ = −1e-6 divides by zero); a one-sample group passes its raw
      reward r through (μ is taken as 0 there).

    The harness follows prime-rl's guard (μ ≤ 0 → 0: with non-negative rewards, μ = 0 means no
    sample succeeded and there is nothing to learn) and its one-row rule (output 0, as every
    group-centred scope here), and takes eps from the config, so eps 0 is prime-rl's formula
    and eps 1e-6 SkyRL's for non-negative rewards in groups of two or more.
    """
    positive = mu > 0
    safe = torch.where(positive, mu + eps, torch.ones_like(mu))
    return torch.where(positive, centred / safe, torch.zeros_like(centred))

"""A saturating learning-curve fit (sigmoid or exponential) of a cell's reward curve."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize, special


@dataclass(frozen=True)
class CurveFit:
    """A fitted saturating reward curve; ``ok`` False (and NaN numbers) with a ``reason`` if not.

    ``asymptote`` is A, ``r0`` the reward at step 0, ``half_step`` the step at which half of the
    gain ``A − r0`` is reached (ScaleRL's C_mid), ``exponent`` the sigmoid's B (NaN for the
    exponential form), ``rmse`` the root-mean-square residual, ``extrapolated`` True when
    ``half_step`` lies beyond the last observed step (then A is an extrapolation).
    """

    form: str
    ok: bool
    reason: str
    asymptote: float = math.nan
    r0: float = math.nan
    half_step: float = math.nan
    exponent: float = math.nan
    rmse: float = math.nan
    extrapolated: bool = False
    at_bound: bool = False  # A landed on the edge of ``value_range``

    def predict(self, steps: ArrayLike) -> np.ndarray:
        t = np.asarray(steps, dtype=float)
        if self.form == "sigmoid":
            return _sigmoid(t, self.r0, self.asymptote, self.half_step, self.exponent)
        return _exponential(t, self.r0, self.asymptote, self.half_step)


def _sigmoid(t: np.ndarray, r0: float, a: float, c_mid: float, b: float) -> np.ndarray:
    # r0 + (A − r0) / (1 + (C_mid/t)^B), written as expit(B (ln t − ln C_mid)) so t = 0 gives r0.
    with np.errstate(divide="ignore"):
        return r0 + (a - r0) * special.expit(b * (np.log(t) - np.log(c_mid)))


def _exponential(t: np.ndarray, r0: float, a: float, t_half: float) -> np.ndarray:
    # A − (A − r0) · 2^(−t / t_half): half the gain at t_half.
    return a - (a - r0) * np.exp2(-t / t_half)


def fit_saturating_curve(
    steps: ArrayLike,
    rewards: ArrayLike,
    *,
    form: Literal["sigmoid", "exponential"] = "sigmoid",
    value_range: tuple[float, float] | None = None,
    max_half_step: float | None = None,
) -> CurveFit:
    """Fit a saturating curve to a (cell's mean) reward curve; never raises for bad data.

    * ``form="sigmoid"`` (ScaleRL, Khatri et al. 2025, arXiv 2510.13786, with compute replaced by
      steps): ``r(t) = r0 + (A − r0) / (1 + (C_mid / t)^B)``; four parameters, ``r(0) = r0``.
    * ``form="exponential"``: ``r(t) = A − (A − r0) 2^(−t / t_half)``; three parameters.

    Both report ``half_step`` = the step where half of the gain ``A − r0`` is reached (C_mid or
    t_half): "efficiency", separate from the ceiling A.  Fitted with
    ``scipy.optimize.curve_fit`` (trust-region, bounded: ``C_mid``, ``t_half`` in
    ``(0, 100 t_max]``, ``B`` in ``[0.05, 20]``) from a few starting points, keeping the best.

    ``value_range`` bounds A and r0 to the metric's range (a reward in [0, 1] cannot saturate
    at 2.36); ``max_half_step`` bounds the half-step to the horizon.  A bounded fit whose
    half-step lands on ``max_half_step`` has not saturated within the horizon: its ceiling is
    not identified: it is returned with ``ok=False`` and that reason instead of numbers.  A fit
    whose A lands on the edge of ``value_range`` is kept with ``at_bound`` True.

    Steps must be >= 0.  Non-finite points are ignored.  Returns ``CurveFit(ok=False, reason=...)``
    when there are too few points, no variation, or the optimizer fails.
    """
    if form not in ("sigmoid", "exponential"):
        raise ValueError(f"form must be 'sigmoid' or 'exponential', got {form!r}")
    points = _points(steps, rewards, form)
    if isinstance(points, CurveFit):
        return points
    t, r = points
    space = _search_space(t, r, form, value_range, max_half_step)
    if isinstance(space, CurveFit):
        return space
    best, best_sse, last_err = _best_fit(space, t, r)
    if best is None:
        return CurveFit(form, False, last_err)
    r0, a, half = float(best[0]), float(best[1]), float(best[2])
    if max_half_step is not None and half >= 0.999 * space.top_half:
        return CurveFit(
            form,
            False,
            f"no saturation within {max_half_step:g} steps: the ceiling is not identified",
        )
    b = float(best[3]) if form == "sigmoid" else math.nan
    span = float(r.max() - r.min())
    lo_r, hi_r = space.lower[0], space.upper[0]
    return CurveFit(
        form=form,
        ok=True,
        reason="",
        asymptote=a,
        r0=r0,
        half_step=half,
        exponent=b,
        rmse=math.sqrt(best_sse / t.size),
        extrapolated=half > float(t.max()),
        # Noisy rewards around a plateau reach past it, so a ceiling pinned to the edge of the
        # allowed range is a curve still moving, whose real ceiling may lie beyond.
        at_bound=value_range is not None and not lo_r + 1e-3 * span < a < hi_r - 1e-3 * span,
    )


def _points(
    steps: ArrayLike, rewards: ArrayLike, form: str
) -> tuple[np.ndarray, np.ndarray] | CurveFit:
    """The finite (step, reward) points as float arrays, or the unfit ``CurveFit`` saying why
    they cannot be fitted (unreadable, of different lengths, too few for the form's
    parameters, a negative step, or no variation)."""
    n_params = 4 if form == "sigmoid" else 3
    try:
        t = np.asarray(steps, dtype=float).ravel()
        r = np.asarray(rewards, dtype=float).ravel()
    except (TypeError, ValueError) as e:
        return CurveFit(form, False, f"could not read steps/rewards as numbers: {e}")
    if t.shape != r.shape:
        return CurveFit(form, False, f"steps {t.shape} and rewards {r.shape} differ in length")
    keep = np.isfinite(t) & np.isfinite(r)
    t, r = t[keep], r[keep]
    if t.size < n_params + 1:
        return CurveFit(form, False, f"{t.size} finite points; need at least {n_params + 1}")
    if (t < 0).any():
        return CurveFit(form, False, "steps must be >= 0")
    if float(r.max() - r.min()) == 0.0 or float(t.max() - t.min()) == 0.0:
        return CurveFit(form, False, "no variation in the rewards or the steps")
    return t, r


@dataclass(frozen=True)
class _Space:
    """The fit's model, its parameter bounds (r0, A, half-step[, B]), its starting points and
    the largest half-step allowed."""

    model: Callable[..., np.ndarray]
    lower: list[float]
    upper: list[float]
    starts: list[list[float]]
    top_half: float


def _search_space(
    t: np.ndarray,
    r: np.ndarray,
    form: str,
    value_range: tuple[float, float] | None,
    max_half_step: float | None,
) -> _Space | CurveFit:
    """Bounds and starts: A and r0 within ten spans of the rewards (and ``value_range``), the
    half-step in (0, 100 t_max] (and at most ``max_half_step``), B in [0.05, 20]; starts from
    the mean of the first and last tenth of the points at a few half-steps (and exponents)."""
    span = float(r.max() - r.min())
    t_max = float(t.max())
    order = np.argsort(t)
    head = float(np.mean(r[order][: max(1, t.size // 10)]))
    tail = float(np.mean(r[order][-max(1, t.size // 10) :]))
    lo_r, hi_r = float(r.min()) - 10 * span, float(r.max()) + 10 * span
    if value_range is not None:
        lo_r, hi_r = max(lo_r, float(value_range[0])), min(hi_r, float(value_range[1]))
        if not lo_r < hi_r:
            return CurveFit(form, False, f"empty value range {value_range}")
    top_half = 100 * t_max if max_half_step is None else min(100 * t_max, float(max_half_step))
    if form == "sigmoid":
        return _Space(
            _sigmoid,
            [lo_r, lo_r, 1e-9 * t_max, 0.05],
            [hi_r, hi_r, top_half, 20.0],
            [[head, tail, c * t_max, b] for c in (0.1, 0.3, 1.0) for b in (1.0, 2.5)],
            top_half,
        )
    return _Space(
        _exponential,
        [lo_r, lo_r, 1e-9 * t_max],
        [hi_r, hi_r, top_half],
        [[head, tail, c * t_max] for c in (0.05, 0.2, 1.0)],
        top_half,
    )


def _best_fit(space: _Space, t: np.ndarray, r: np.ndarray) -> tuple[np.ndarray | None, float, str]:
    """``scipy.optimize.curve_fit`` (bounded trust-region) from each start: the parameters with
    the least sum of squared residuals, that sum, and the last optimizer error (for when no
    start gives a finite fit)."""
    best, best_sse, last_err = None, math.inf, "optimizer did not converge"
    for start in space.starts:
        p0 = np.clip(start, space.lower, space.upper)
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", optimize.OptimizeWarning)
                p, _ = optimize.curve_fit(
                    space.model,
                    t,
                    r,
                    p0=p0,
                    bounds=(space.lower, space.upper),
                    method="trf",
                    maxfev=5000,
                )
                sse = float(np.sum((space.model(t, *p) - r) ** 2))
        except (RuntimeError, ValueError, optimize.OptimizeWarning, FloatingPointError) as e:
            last_err = f"curve_fit failed: {e}"
            continue
        if np.all(np.isfinite(p)) and np.isfinite(sse) and sse < best_sse:
            best, best_sse = p, sse
    return best, best_sse, last_err

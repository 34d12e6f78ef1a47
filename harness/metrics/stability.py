"""Per-run stability summaries from a run's per-step metric history (pure numpy).

A history maps a metric name to its per-step values, index = step (0..N-1).  Only *finite*
values count as logged: NaN means "not logged at this step" (e.g. ``eval/accuracy`` between
evaluations) and ±inf is ignored too (non-finite events are counted by the training loop in
``stability/nonfinite_count``).  A missing metric, an unreadable one, or one with no finite value
gives NaN for the summaries that need it; :func:`summarize_run` never raises for bad data.

``docs/stability.md`` defines every summary once; this module implements those definitions.
The cross-seed statistics over these summaries are in :mod:`harness.report.stats`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["OBJECTIVE_KEYS", "RUN_KEYS", "RUN_SUMMARY_KEYS", "check_run_names", "summarize_run"]

REWARD = "objective/reward"
EVAL_ACCURACY = "eval/accuracy"
EVAL_SAMPLED = ("eval/pass_at_1", "eval/pass_at_k", "eval/mean_at_n")  # with eval.samples > 0
APPROX_KL = "policy/approx_kl"
ENTROPY = "policy/entropy"
CLIPFRAC = "policy/clipfrac"
GRAD_NORM = "stability/grad_norm"
NONFINITE_COUNT = "stability/nonfinite_count"
SKIPPED_STEPS = "stability/skipped_updates"  # per-step count; the run summary sums it
MISMATCH_KL = "mismatch/kl_k3"
# Logged by asynchronous runs only (rollout.async): per step, over the batch's generated tokens.
TOKEN_LAG_MEAN = "async/token_lag_mean"
TOKEN_LAG_MAX = "async/token_lag_max"
MIXED_VERSIONS = "async/mixed_version_fraction"

# The summaries of the reward curve alone (NaN when no reward was logged).
_REWARD_KEYS: tuple[str, ...] = (
    "final/reward",
    "best/reward",
    "final/reward_auc",
    "final/steps_to_threshold",
    "stability/max_drawdown",
    "stability/max_drawdown_frac",
    "stability/collapsed",
)

#: The keys :func:`summarize_run` returns, in order.
RUN_SUMMARY_KEYS: tuple[str, ...] = (
    *_REWARD_KEYS,
    "final/eval_accuracy",
    "final/eval_pass_at_1",
    "final/eval_pass_at_k",
    "final/eval_mean_at_n",
    "stability/max_approx_kl",
    "stability/mean_approx_kl",
    "stability/kl_spikes",
    "stability/kl_over_threshold",
    "stability/grad_norm_spikes",
    "stability/mean_clipfrac",
    "stability/frac_high_clip",
    "stability/entropy_ratio",
    "stability/nonfinite_events",
    "stability/skipped_steps",
    "stability/mismatch_kl_k3_mean",
    "stability/mismatch_kl_k3_max",
    "stability/token_lag_mean",
    "stability/token_lag_max",
    "stability/mixed_version_fraction",
    "stability/diverged",
    "stability/diverged_step",
)

#: Every key of a run's summary (what an experiment's ``metric:`` or a search objective may
#: name): :data:`RUN_SUMMARY_KEYS` plus what the training loop adds around them.
OBJECTIVE_KEYS: tuple[str, ...] = (
    *RUN_SUMMARY_KEYS,
    "final/eval_reward",
    "start/reward",
    "start/eval_reward",
    "start/eval_accuracy",
    "start/eval_pass_at_1",
    "start/eval_pass_at_k",
)

#: Logged once per run beside the summaries (not objectives): how far it got, how long it took.
STEPS_DONE = "final/steps_done"
WALL_TIME = "final/wall_time"

#: Every key a run logs once, at its end.
RUN_KEYS: frozenset[str] = frozenset((*OBJECTIVE_KEYS, STEPS_DONE, WALL_TIME))


def check_run_names(summary: Mapping[str, float]) -> None:
    """Guard against a run-level key that is not defined here (a typo would fork a summary)."""
    unknown = [k for k in summary if k not in RUN_KEYS]
    if unknown:
        raise KeyError(f"run summary names not in harness.metrics.stability.RUN_KEYS: {unknown}")


#: The windows a run's start and end are averaged over: ``start/reward`` is the mean of the
#: first START_WINDOW logged rewards (set by the training loops), ``final/reward`` the mean of
#: the last FINAL_WINDOW (``summarize_run``'s ``last_k``).
START_WINDOW = 10
FINAL_WINDOW = 10
#: The trailing-mean smoothing both training loops (harness and TRL) pass to ``summarize_run``
#: for the drawdown and collapse summaries: one noisy batch is not a collapse.
RUN_SMOOTH = 5

#: A running-median spike test needs at least this many earlier finite values.
MIN_SPIKE_HISTORY = 3

_NAN = math.nan


def _series(history: Mapping[str, ArrayLike], key: str) -> np.ndarray | None:
    """The metric as a 1-D float array indexed by step, or None if missing or unreadable."""
    try:
        raw = history.get(key)
        if raw is None:
            return None
        a = np.atleast_1d(np.asarray(raw, dtype=float)).ravel()
    except (TypeError, ValueError, AttributeError):
        return None
    return a


def _logged(history: Mapping[str, ArrayLike], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the finite entries; both empty when the metric is absent."""
    a = _series(history, key)
    if a is None:
        return np.empty(0, dtype=np.int64), np.empty(0)
    steps = np.flatnonzero(np.isfinite(a))
    return steps, a[steps]


def _running_median_spikes(
    values: np.ndarray, factor: float, window: int, floor: float = 0.0
) -> np.ndarray:
    """Mask of v_j > factor × median(v over the up-to-``window`` previous values) and v_j > floor.

    Tested only from the MIN_SPIKE_HISTORY-th value on; a running median <= 0 never flags (any
    positive value would otherwise be a "spike").  ``floor`` keeps float noise (a KL of 1e-12
    against a median of 1e-13) from counting.
    """
    spike = np.zeros(values.size, dtype=bool)
    for j in range(MIN_SPIKE_HISTORY, values.size):
        med = float(np.median(values[max(0, j - window) : j]))
        spike[j] = med > 0.0 and values[j] > factor * med and values[j] > floor
    return spike


def _trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last ``window`` values up to and including each position (fewer at the start)."""
    if window <= 1:
        return values
    c = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, values.size + 1)
    start = np.maximum(0, idx - window)
    return (c[idx] - c[start]) / (idx - start)


def _reward_summaries(
    history: Mapping[str, ArrayLike],
    last_k: int,
    reward_threshold: float | None,
    collapse_fraction: float,
    smooth: int,
) -> dict[str, float]:
    steps, r = _logged(history, REWARD)
    out = dict.fromkeys(_REWARD_KEYS, _NAN)
    if r.size == 0:
        return out
    out["final/reward"] = float(np.mean(r[-last_k:]))
    out["best/reward"] = float(np.max(r))
    out["final/reward_auc"] = float(np.mean(r))
    if reward_threshold is not None:
        hit = np.flatnonzero(r >= reward_threshold)
        if hit.size:
            out["final/steps_to_threshold"] = float(steps[hit[0]])
    s = _trailing_mean(r, smooth)
    peak = np.maximum.accumulate(s)
    drawdown = peak - s
    t_star = int(np.argmax(drawdown))  # first step of the largest drawdown
    out["stability/max_drawdown"] = float(drawdown[t_star])
    if peak[t_star] > 0.0:
        frac = float(drawdown[t_star] / peak[t_star])
        out["stability/max_drawdown_frac"] = frac
        out["stability/collapsed"] = 1.0 if frac > collapse_fraction else 0.0
    return out


def summarize_run(
    history: Mapping[str, Sequence[float] | np.ndarray],
    *,
    last_k: int = FINAL_WINDOW,
    reward_threshold: float | None = None,
    collapse_fraction: float = 0.5,
    kl_spike_factor: float = 5.0,
    kl_spike_floor: float = 1e-4,
    kl_threshold: float = 0.1,
    grad_spike_factor: float = 5.0,
    spike_window: int = 50,
    clipfrac_threshold: float = 0.2,
    smooth: int = 1,
    diverged_step: int | None = None,
) -> dict[str, float]:
    """Stability summary of one run: the keys of :data:`RUN_SUMMARY_KEYS`, all floats.

    ``history`` maps metric name -> per-step values (index = step; NaN = not logged).  Values
    are NaN when undefined (metric missing, nothing logged, or the ratio's denominator is not
    positive).  The definitions, with r_t the finite logged rewards in step order:

    * ``final/reward``: mean of the last ``last_k`` logged rewards (all of them if fewer).
    * ``best/reward``: max_t r_t.
    * ``final/reward_auc``: mean of the logged rewards (area under the reward curve / steps).
    * ``final/steps_to_threshold``: first step with r_t >= ``reward_threshold`` (NaN if never or
      no threshold).
    * ``stability/max_drawdown``: D = max_t (P_t − s_t), with s_t the reward smoothed by a trailing
      mean over ``smooth`` logged steps (``smooth=1``, this function's default: none; the
      training loops pass :data:`RUN_SMOOTH`) and P_t = max_{u<=t} s_u.
    * ``stability/max_drawdown_frac``: D / P_{t*} at the first t* attaining D, when P_{t*} > 0.
    * ``stability/collapsed``: 1.0 if max_drawdown_frac > ``collapse_fraction`` else 0.0 (NaN when
      the fraction is undefined).
    * ``final/eval_accuracy``: last logged ``eval/accuracy``; ``final/eval_pass_at_1``,
      ``final/eval_pass_at_k``, ``final/eval_mean_at_n`` likewise (NaN without eval.samples).
    * ``stability/max_approx_kl``, ``stability/mean_approx_kl``: max and mean of |approx_kl| over
      logged steps (magnitude, because ``policy/approx_kl`` may be a signed log-ratio, k1).
    * ``stability/kl_spikes``: steps with |kl_t| > ``kl_spike_factor`` × running median of |kl| and
      |kl_t| > ``kl_spike_floor``: spikes relative to the run's own KL scale.
    * ``stability/kl_over_threshold``: steps with |kl_t| > ``kl_threshold`` (absolute; saturates in
      runs whose KL sits above the threshold throughout, which is why spikes are relative).
    * ``stability/grad_norm_spikes``: steps with g_t > ``grad_spike_factor`` × running median of g.
      A running median is the median of the up to ``spike_window`` previous logged values; it is
      only tested with >= 3 of them and only when positive.
    * ``stability/mean_clipfrac``: mean of ``policy/clipfrac`` over logged steps.
    * ``stability/frac_high_clip``: fraction of logged steps with ``policy/clipfrac`` >
      ``clipfrac_threshold`` (absolute; 0 in most CPU-scale runs, see docs/stability.md).
    * ``stability/entropy_ratio``: mean of the last ``last_k`` logged entropies / mean of the first
      ``last_k`` (NaN if the first mean is 0).
    * ``stability/nonfinite_events``, ``stability/skipped_steps``: sums of the per-step counts
      ``stability/nonfinite_count`` and ``stability/skipped_updates``.
    * ``stability/mismatch_kl_k3_mean``, ``stability/mismatch_kl_k3_max``: mean and max of
      ``mismatch/kl_k3`` (sampler vs learner, k3, ≥ 0) over logged steps.
    * ``stability/token_lag_mean``, ``stability/token_lag_max``: mean over logged steps of
      ``async/token_lag_mean`` and max of ``async/token_lag_max`` (asynchronous runs only: how
      many updates behind the learner the generated tokens were sampled).
    * ``stability/mixed_version_fraction``: mean over logged steps of
      ``async/mixed_version_fraction`` (the share of sequences sampled by two versions or more).
    * ``stability/diverged``: 1.0 when ``diverged_step`` is given (the training loop decides
      divergence), else 0.0; ``stability/diverged_step``: that step, else NaN.
    """
    if last_k < 1 or spike_window < 1 or smooth < 1:
        raise ValueError("last_k, spike_window and smooth must be >= 1")
    out = dict.fromkeys(RUN_SUMMARY_KEYS, _NAN)
    out.update(_reward_summaries(history, last_k, reward_threshold, collapse_fraction, smooth))
    out.update(_eval_summaries(history))
    out.update(
        _kl_and_grad_summaries(
            history, kl_spike_factor, kl_spike_floor, kl_threshold, grad_spike_factor, spike_window
        )
    )
    out.update(_policy_summaries(history, last_k, clipfrac_threshold))
    out.update(_count_summaries(history))
    out.update(_async_summaries(history))
    out["stability/diverged"] = 0.0 if diverged_step is None else 1.0
    out["stability/diverged_step"] = _NAN if diverged_step is None else float(diverged_step)
    return out


def _eval_summaries(history: Mapping[str, ArrayLike]) -> dict[str, float]:
    """The last logged value of each eval metric, as ``final/eval_*`` (absent when none)."""
    out: dict[str, float] = {}
    for key in (EVAL_ACCURACY, *EVAL_SAMPLED):
        _, logged = _logged(history, key)
        if logged.size:
            out["final/eval_" + key.split("/", 1)[1]] = float(logged[-1])
    return out


def _kl_and_grad_summaries(
    history: Mapping[str, ArrayLike],
    kl_spike_factor: float,
    kl_spike_floor: float,
    kl_threshold: float,
    grad_spike_factor: float,
    spike_window: int,
) -> dict[str, float]:
    """Max and mean of |approx_kl|, its spikes against the running median and its steps over
    the absolute threshold, and the grad-norm spikes (each absent when not logged)."""
    out: dict[str, float] = {}
    _, kl = _logged(history, APPROX_KL)
    if kl.size:
        mag = np.abs(kl)
        out["stability/max_approx_kl"] = float(mag.max())
        out["stability/mean_approx_kl"] = float(mag.mean())
        spikes = _running_median_spikes(mag, kl_spike_factor, spike_window, kl_spike_floor)
        out["stability/kl_spikes"] = float(np.count_nonzero(spikes))
        out["stability/kl_over_threshold"] = float(np.count_nonzero(mag > kl_threshold))
    _, g = _logged(history, GRAD_NORM)
    if g.size:
        spikes = _running_median_spikes(g, grad_spike_factor, spike_window)
        out["stability/grad_norm_spikes"] = float(np.count_nonzero(spikes))
    return out


def _policy_summaries(
    history: Mapping[str, ArrayLike], last_k: int, clipfrac_threshold: float
) -> dict[str, float]:
    """The mean clip fraction and the share of steps above ``clipfrac_threshold``, and the
    entropy's end/start ratio (each absent when not logged or undefined)."""
    out: dict[str, float] = {}
    _, c = _logged(history, CLIPFRAC)
    if c.size:
        out["stability/mean_clipfrac"] = float(np.mean(c))
        out["stability/frac_high_clip"] = float(np.mean(c > clipfrac_threshold))
    _, h = _logged(history, ENTROPY)
    if h.size:
        start = float(np.mean(h[:last_k]))
        if start != 0.0:
            out["stability/entropy_ratio"] = float(np.mean(h[-last_k:])) / start
    return out


def _count_summaries(history: Mapping[str, ArrayLike]) -> dict[str, float]:
    """The sums of the per-step non-finite and skipped-update counts, and the mean and max of
    the sampler-vs-learner mismatch KL (each absent when not logged)."""
    out: dict[str, float] = {}
    for src, dst in (
        (NONFINITE_COUNT, "stability/nonfinite_events"),
        (SKIPPED_STEPS, "stability/skipped_steps"),
    ):
        _, v = _logged(history, src)
        if v.size:
            out[dst] = float(np.sum(v))
    _, mm = _logged(history, MISMATCH_KL)
    if mm.size:
        out["stability/mismatch_kl_k3_mean"] = float(np.mean(mm))
        out["stability/mismatch_kl_k3_max"] = float(np.max(mm))
    return out


def _async_summaries(history: Mapping[str, ArrayLike]) -> dict[str, float]:
    """The run's token lag (mean of the per-step means, max of the per-step maxima) and its
    mean share of mixed-version sequences (each absent when not logged: synchronous runs)."""
    out: dict[str, float] = {}
    for src, dst, agg in (
        (TOKEN_LAG_MEAN, "stability/token_lag_mean", np.mean),
        (TOKEN_LAG_MAX, "stability/token_lag_max", np.max),
        (MIXED_VERSIONS, "stability/mixed_version_fraction", np.mean),
    ):
        _, v = _logged(history, src)
        if v.size:
            out[dst] = float(agg(v))
    return out

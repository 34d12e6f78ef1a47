"""One search point a worker claimed: sample it, train its seeds, prune between them, tell it.

:class:`SearchPoint` is a point's state and its steps (begin, each seed's config, each seed's
result, the end), so that a point trains the same whether alone (:func:`run_search_trial`,
seed after seed) or packed with other points of the same seed
(:mod:`harness.sweep.launching.packed_search`).
"""

from __future__ import annotations

import math
import time
from typing import Any

from harness.core.configtools import ConfigError
from harness.core.db import with_retries
from harness.core.failures import WarmStartDiverged
from harness.core.fsutil import fatal_store_error
from harness.report.allocation import race
from harness.sweep.launching.trial import ClaimedTrial, end_retried_runs
from harness.sweep.scheduler.adaptive import incumbent
from harness.sweep.scheduler.trials import failure_reason, nanmean
from harness.sweep.stores.optuna_adapter import heartbeat


class SearchPoint:
    """A claimed search trial as it trains: its sampled point, each objective's value per seed
    trained so far, how many seeds diverged, and once ended, its outcome."""

    def __init__(self, t: ClaimedTrial) -> None:
        assert t.spec.search is not None
        self.t = t
        self.plan = t.spec.search
        self.label = f"trial {t.trial.number}"
        self.point: dict[str, Any] = {}
        self.values: list[list[float]] = [[] for _ in self.plan.objectives]
        self.diverged = 0
        self.t0 = time.time()
        self.outcome: str | None = None  # set when the point has ended

    def begin(self) -> None:
        """A dead worker's point, run again: end its runs KILLED; then sample the point."""
        end_retried_runs(self.t)
        self.point = self.plan.suggest(self.t.trial)
        self.t0 = time.time()

    def config(self, seed: int) -> Any | None:
        """The run config of ``seed`` at this point; None when the config rejects the point
        (``c_clip <= 1``, ...): the point has then ended PRUNED."""
        t = self.t
        try:
            return t.spec.run_config(self.point, seed, device=t.opts.device, threads=t.opts.threads)
        except ConfigError as err:
            attrs = {"outcome": "pruned", "reason": f"invalid point: {err}"}
            self._end(seed, "PRUNED", attrs, reason=str(err))
            return None

    def record(self, i: int, seed: int, result: Any) -> str | None:
        """Seed number ``i`` trained: its values, then the pruner and racing; the outcome when
        the point has ended (interrupted, pruned, raced out), None to train the next seed."""
        if result.status == "interrupted":
            return self._end(seed, "FAIL", {"outcome": "interrupted", "reason": result.reason})
        self.diverged += result.status == "diverged"
        for j, (metric, _) in enumerate(self.plan.objectives):
            self.values[j].append(result.summary.get(metric, math.nan))
        return self._prune_between_seeds(i, seed)

    def fail(self, err: BaseException, seed: int | None) -> str:
        """The point raised (its run, or building it): it ends as an ``error``, or PRUNED when
        :meth:`rejected` says the point's own settings caused it."""
        rejected = self.rejected(seed, failure_reason(err))
        if rejected is not None:
            return rejected
        self.outcome = self.t.fail_with_error(err, self.label, seed)
        return self.outcome

    def rejected(self, seed: int | None, reason: str, rid: str | None = None) -> str | None:
        """A warm start that diverged at a point whose warm-start settings the search varies:
        the point cannot train, so it ends PRUNED with the reason, as a point the config
        rejects; an error would stop the search, and a resume would run the same point again.
        None when the search varies no ``warm_start.`` field (every point shares the failure)
        or ``reason`` is another failure."""
        if not reason.startswith(f"{WarmStartDiverged.__name__}: "):
            return None
        if not any(p.path.startswith("warm_start.") for p in self.plan.params):
            return None
        attrs = {"outcome": "pruned", "reason": f"the point cannot train: {reason}"}
        if rid is not None:
            attrs["run_id"] = rid
        return self._end(seed, "PRUNED", attrs, reason=reason)

    def failed_run(self, seed: int, reason: str, rid: str) -> str:
        """Its run ``rid`` failed inside a pack (the pack caught the error, the others went
        on): the point ends as an ``error`` with the run's reason, as a grid pack's trial (or
        PRUNED, :meth:`rejected`)."""
        rejected = self.rejected(seed, reason, rid)
        if rejected is not None:
            return rejected
        t = self.t
        if not t.set_attrs({"outcome": "error", "reason": reason, "run_id": rid}):
            self.outcome = t.superseded(rid, self.label, seed)
        elif not t.tell(state="FAIL"):
            self.outcome = t.superseded(rid, self.label, seed)
        else:
            t.event("done", cell=self.label, seed=seed, outcome="error", reason=reason)
            self.outcome = "error"
        return self.outcome

    def finish(self, wall_s: float | None = None) -> str:
        """Every seed trained: tell the point's mean objectives (FAIL when one has no finite
        value); returns the outcome, "interrupted" when a retry copy superseded the point.
        ``wall_s``: its time (default: since it began)."""
        t = self.t
        values = self.values
        out = [nanmean(v) for v in values]
        t.trial.set_user_attr("diverged_seeds", self.diverged)
        t.trial.set_user_attr("seeds_run", len(t.spec.seeds))
        # Each seed's value of each objective (None = not finite): the spread the report and
        # `export --best` show next to the mean.
        t.trial.set_user_attr("seed_values", [[_finite(v) for v in vs] for vs in values])
        t.trial.set_user_attr("wall_time", time.time() - self.t0 if wall_s is None else wall_s)
        if all(math.isfinite(v) for v in out):
            t.trial.set_user_attr("outcome", "completed")
            ok = t.tell(*out)
            outcome = "completed"
        else:
            t.trial.set_user_attr("outcome", "diverged")
            objectives = self.plan.objectives
            bad = [m for (m, _), v in zip(objectives, out, strict=True) if not math.isfinite(v)]
            t.trial.set_user_attr(
                "reason", f"{', '.join(bad)}: no finite value in any seed (nothing to optimize)"
            )
            ok = t.tell(state="FAIL")
            outcome = "diverged"
        if not ok:
            t.event("done", cell=self.label, seed=None, outcome="interrupted", reason="superseded")
            self.outcome = "interrupted"
            return self.outcome
        t.event("done", cell=self.label, seed=None, outcome=outcome, values=out, point=self.point)
        self.outcome = outcome
        return outcome

    def _end(self, seed: int | None, state: str, attrs: dict[str, Any], **event: Any) -> str:
        """End the point before its last seed: its attributes (``outcome`` first), the state
        told, and its ``done`` event; returns the outcome."""
        t = self.t
        for k, v in attrs.items():
            t.trial.set_user_attr(k, v)
        t.tell(state=state)
        t.event("done", cell=self.label, seed=seed, outcome=attrs["outcome"], **event)
        self.outcome = str(attrs["outcome"])
        return self.outcome

    def _prune_between_seeds(self, i: int, seed: int) -> str | None:
        """After seed number ``i`` of a single-objective search: the point raced out against
        the incumbent or pruned on its running mean ("pruned"), or None to train the next
        seed."""
        if len(self.values) != 1:
            return None
        t, values = self.t, self.values[0]
        raced = race_out(t, values)
        if raced is not None:
            attrs = {
                "outcome": "pruned",
                "reason": raced,
                "seeds_run": i + 1,
                "seed_values": [[_finite(v) for v in values]],
            }
            return self._end(seed, "PRUNED", attrs, reason=raced)
        mean0 = nanmean(values)
        t.trial.report(mean0, step=i)
        if t.trial.should_prune():
            attrs = {"outcome": "pruned", "seeds_run": i + 1}
            return self._end(seed, "PRUNED", attrs, values=[mean0])
        return None


def run_search_trial(t: ClaimedTrial) -> str:
    """Sample a point, train every seed at it (pruning between seeds), tell the mean objectives."""
    p = SearchPoint(t)
    with heartbeat(t.study, t.trial, on_error=t.beat_failed):
        p.begin()
        seed: int | None = None
        try:
            for i, seed in enumerate(t.spec.seeds):
                cfg = p.config(seed)
                if cfg is None:
                    return str(p.outcome)
                result, _ = t.train(cfg, p.label, seed)
                ended = p.record(i, seed, result)
                if ended is not None:
                    return ended
        except Exception as err:
            if fatal_store_error(err) is not None:
                raise  # not this point's fault: the worker stops (worker_loop)
            return p.fail(err, seed)
    return p.finish()


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def race_out(t: ClaimedTrial, values: list[float]) -> str | None:
    """A search with ``seeds: {min, max, ...}``: at a planned look, the point's seeds against
    the incumbent's same seeds; the reason to stop it (decided worse or equivalent), or None."""
    adaptive = t.spec.adaptive_plan()
    if adaptive is None or len(values) >= adaptive.plan.max:
        return None
    best = with_retries(lambda: incumbent(t.study, t.spec))
    if best is None:
        return None
    number, theirs = best
    maximize = t.spec.direction == "maximize"
    decision = race(values, theirs, adaptive.plan, maximize=maximize)
    if decision is None or decision.verdict not in ("worse", "equivalent"):
        return None
    return f"raced out against trial {number}: {decision.line()}"

"""``harness search``: TPE (or multi-objective) search over run-config ranges.

Each Optuna trial samples one point of the search space and trains every seed of the experiment
at that point, one after another.  After each seed the mean so far is reported as an
intermediate value, so a pruner (median or Wilcoxon) can stop a trial whose first seeds already
lag.  Multi-objective searches (e.g. maximize final/reward, minimize stability/max_drawdown) are
not pruned (Optuna cannot) and end with the Pareto front.

Workers are local processes running ``study.optimize`` against the same storage (journal file or
PostgreSQL), with the heartbeat and stale-trial retry of ``make_storage``; a re-run of the same
command resumes until ``n_trials`` trials are COMPLETE or PRUNED.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import signal
from pathlib import Path
from typing import Any

from harness.configtools import ConfigError
from harness.experiment import ExperimentSpec
from harness.sweep.worker import HASH_ATTR, PARENT_ATTR, SPEC_ATTR


class _Interrupted(Exception):
    pass


def _sampler(spec: ExperimentSpec, worker_id: int) -> Any:
    import optuna

    assert spec.search is not None
    # constant_liar: parallel workers do not all sample the same promising point.
    seed = spec.search.sampler_seed + worker_id
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)


def _pruner(name: str) -> Any:
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=0)
    if name == "wilcoxon":
        return optuna.pruners.WilcoxonPruner(p_threshold=0.1)
    return optuna.pruners.NopPruner()


def search_payload(spec: ExperimentSpec) -> dict[str, Any]:
    from harness.sweep.ablate import resolved_base

    assert spec.search is not None
    return {
        "kind": "search",
        "experiment": spec.name,
        "description": spec.description,
        "grid_hash": spec.grid_hash(),
        "base": resolved_base(spec),
        "seeds": spec.seeds,
        "steps": spec.steps,
        "objectives": spec.search.objectives,
        "n_trials": spec.search.n_trials,
    }


def open_search_study(
    spec: ExperimentSpec, *, storage: Any, tracker: Any, study_name: str | None, command: str
) -> tuple[Any, dict[str, Any]]:
    import optuna

    from harness.sweep.storage import with_retries

    assert spec.search is not None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = study_name or spec.name
    grid_hash = spec.grid_hash()
    directions = [d for _, d in spec.search.objectives]
    try:
        study = with_retries(lambda: optuna.load_study(study_name=name, storage=storage))
        if study.user_attrs.get(HASH_ATTR) != grid_hash:
            raise ConfigError(
                f"study {name!r} already exists with a different search space (hash "
                f"{study.user_attrs.get(HASH_ATTR)} != {grid_hash}); run again with --study-name {name}-2"
            )
    except KeyError:
        study = with_retries(
            lambda: optuna.create_study(study_name=name, storage=storage, directions=directions)  # type: ignore[arg-type]
        )
        study.set_user_attr(HASH_ATTR, grid_hash)
    payload = search_payload(spec)
    parent = study.user_attrs.get(PARENT_ATTR)
    if parent:
        tracker.start_run(experiment=spec.name, run_name=name, run_id=parent)
    else:
        from harness.provenance import provenance_tags

        parent = tracker.start_run(
            experiment=spec.name,
            run_name=f"{name} (search)",
            tags={
                **provenance_tags(),
                "harness.study": name,
                "harness.role": "parent",
                "harness.grid_hash": grid_hash,
            },
        )
        tracker.log_text(
            parent, Path(spec.path).read_text() if spec.path else "", "experiment.yaml"
        )
        study.set_user_attr(PARENT_ATTR, parent)
    tracker.set_tags(parent, {"harness.command": command})
    payload["parent_run_id"] = parent
    study.set_user_attr(SPEC_ATTR, json.dumps(payload, default=str))
    return study, payload


def _objective_factory(
    spec: ExperimentSpec,
    study_name: str,
    tracker: Any,
    results_dir: Path,
    stop: Any,
    threads: int,
    device: str | None,
    events: Any,
) -> Any:
    from harness.config import apply_overrides, build_run_config
    from harness.sweep.ablate import resolved_base
    from harness.tracked import tracked_run

    assert spec.search is not None
    search = spec.search
    base = resolved_base(spec)
    parent = None

    def objective(trial: Any) -> Any:
        import optuna

        nonlocal parent
        if parent is None:
            parent = trial.study.user_attrs.get(PARENT_ATTR)
        point: dict[str, Any] = {}
        for p in search.params:
            if p.type == "categorical":
                point[p.path] = trial.suggest_categorical(p.path, p.choices)
            elif p.type == "int":
                point[p.path] = trial.suggest_int(
                    p.path, int(p.low or 0), int(p.high or 0), log=p.log
                )
            else:
                point[p.path] = trial.suggest_float(
                    p.path, float(p.low or 0.0), float(p.high or 0.0), log=p.log, step=p.step
                )
        values: list[list[float]] = [[] for _ in search.objectives]
        diverged = 0
        for i, seed in enumerate(spec.seeds):
            data = apply_overrides(base, {**point, "seed": seed, "steps": spec.steps})
            if device:
                data["device"] = device
            data["threads"] = data.get("threads") or threads
            try:
                cfg = build_run_config(data)
            except ConfigError as err:  # a sampled point the config rejects (e.g. c_clip <= 1)
                trial.set_user_attr("reason", str(err))
                raise optuna.TrialPruned(f"invalid point: {err}") from None
            _emit(events, {"event": "start", "trial": trial.number, "seed": seed, "point": point})
            result, rid = tracked_run(
                cfg,
                tracker,
                experiment=spec.name,
                run_name=f"trial {trial.number} seed={seed}",
                parent_run_id=parent,
                tags={
                    "harness.study": study_name,
                    "harness.role": "child",
                    "search.trial": str(trial.number),
                    "seed": str(seed),
                },
                should_stop=stop.is_set,
                results_dir=results_dir,
            )
            if result.status == "interrupted":
                raise _Interrupted(result.reason)
            diverged += result.status == "diverged"
            for j, (metric, _) in enumerate(search.objectives):
                values[j].append(result.summary.get(metric, math.nan))
            mean0 = _nanmean(values[0])
            if len(search.objectives) == 1:
                trial.report(mean0, step=i)
                if trial.should_prune():
                    trial.set_user_attr("seeds_run", i + 1)
                    _emit(events, {"event": "pruned", "trial": trial.number, "value": mean0})
                    raise optuna.TrialPruned(f"pruned after {i + 1} seeds")
        trial.set_user_attr("diverged_seeds", diverged)
        trial.set_user_attr("seeds_run", len(spec.seeds))
        out = [_nanmean(v) for v in values]
        _emit(events, {"event": "done", "trial": trial.number, "values": out, "point": point})
        return out[0] if len(out) == 1 else tuple(out)

    return objective


def _nanmean(xs: list[float]) -> float:
    finite = [x for x in xs if math.isfinite(x)]
    return sum(finite) / len(finite) if finite else float("nan")


def _emit(events: Any, e: dict[str, Any]) -> None:
    if events is None:
        return
    try:
        events.put_nowait(e)
    except Exception:
        pass


def search_worker(
    spec: ExperimentSpec,
    study_name: str,
    storage_url: str | None,
    tracking_uri: str | None,
    results_dir: Path,
    worker_id: int,
    threads: int,
    device: str | None,
    stop: Any,
    events: Any,
) -> None:
    import optuna
    import torch

    from harness.sweep.storage import make_storage
    from harness.tracking import make_tracker

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    from harness.perf import tune_malloc

    tune_malloc()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(threads)
    assert spec.search is not None
    storage = make_storage(storage_url, results_dir, heartbeat_interval=5)
    study = optuna.load_study(
        study_name=study_name,
        storage=storage,
        sampler=_sampler(spec, worker_id),
        pruner=_pruner(spec.search.pruner),
    )
    tracker = make_tracker(tracking_uri, results_dir)
    from optuna.study import MaxTrialsCallback
    from optuna.trial import TrialState

    max_trials = MaxTrialsCallback(
        spec.search.n_trials, states=(TrialState.COMPLETE, TrialState.PRUNED)
    )

    def stop_cb(study: Any, trial: Any) -> None:
        if stop.is_set():
            study.stop()

    done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
    if done < spec.search.n_trials:
        study.optimize(
            _objective_factory(
                spec, study_name, tracker, results_dir, stop, threads, device, events
            ),
            callbacks=[max_trials, stop_cb],
            catch=(_Interrupted,),
            gc_after_trial=True,
        )
    tracker.flush()


def run_search_workers(
    spec: ExperimentSpec,
    study_name: str,
    *,
    n_workers: int,
    storage_url: str | None,
    tracking_uri: str | None,
    results_dir: Path,
    devices: list[str] | None,
) -> bool:
    """Returns True if interrupted by the user."""
    from rich.console import Console

    console = Console(stderr=True)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    events = ctx.Queue()
    threads = 1  # as in `ablate`: results must not depend on the number of workers
    procs = []
    for i in range(n_workers):
        dev = devices[i % len(devices)] if devices else None
        p = ctx.Process(
            target=search_worker,
            args=(
                spec,
                study_name,
                storage_url,
                tracking_uri,
                results_dir,
                i,
                threads,
                dev,
                stop,
                events,
            ),
        )
        p.start()
        procs.append(p)
    import queue

    from harness.sweep.ablate import StopSignals

    signals = StopSignals(stop, procs)
    try:
        with signals:
            while any(p.is_alive() for p in procs) or not events.empty():
                try:
                    e = events.get(timeout=0.5)
                except queue.Empty:
                    continue
                if e["event"] == "done":
                    values = ", ".join(f"{v:.4g}" for v in e["values"])
                    console.print(f"trial {e['trial']}: {values}  {_fmt_point(e['point'])}")
                elif e["event"] == "pruned":
                    console.print(f"trial {e['trial']}: pruned at {e['value']:.4g}")
    finally:
        for p in procs:
            p.join(timeout=30)
    return signals.interrupted


def _fmt_point(point: dict[str, Any]) -> str:
    return " ".join(
        f"{k.split('.')[-1]}={v:.4g}" if isinstance(v, float) else f"{k.split('.')[-1]}={v}"
        for k, v in point.items()
    )


def finish_search(study: Any, tracker: Any, payload: dict[str, Any]) -> None:
    """Print the best point (or the Pareto front) and log it on the parent run."""
    from optuna.trial import TrialState
    from rich.console import Console
    from rich.table import Table

    console = Console()
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    pruned = study.get_trials(deepcopy=False, states=(TrialState.PRUNED,))
    parent = payload.get("parent_run_id")
    objectives = payload["objectives"]
    if not complete:
        console.print("no completed trial yet")
        return
    best = study.best_trials if len(objectives) > 1 else [study.best_trial]
    title = "Pareto front" if len(objectives) > 1 else "best trial"
    table = Table(
        title=f"{study.study_name}: {title} ({len(complete)} complete, {len(pruned)} pruned)"
    )
    table.add_column("trial")
    for metric, direction in objectives:
        table.add_column(f"{metric} ({direction})", justify="right")
    table.add_column("params")
    for t in best:
        table.add_row(str(t.number), *[f"{v:.4g}" for v in t.values], _fmt_point(t.params))
    console.print(table)
    if parent:
        top = best[0]
        tracker.set_tags(
            parent, {"search.best_trial": str(top.number), "search.pareto_size": str(len(best))}
        )
        tracker.log_text(
            parent,
            json.dumps(
                [{"trial": t.number, "values": t.values, "params": t.params} for t in best],
                indent=2,
                default=str,
            ),
            "best_trials.json",
        )
        tracker.log_metrics(
            parent,
            {f"best/{m}": v for (m, _), v in zip(objectives, top.values, strict=True)},
            step=0,
        )
        # Tags, not params: a resumed search may find a better point and tags can change.
        tracker.set_tags(parent, {f"best.{k}": str(v) for k, v in top.params.items()})
        total = len(complete) + len(pruned)
        tracker.end_run(parent, "FINISHED" if total >= payload["n_trials"] else "KILLED")
    tracker.flush()

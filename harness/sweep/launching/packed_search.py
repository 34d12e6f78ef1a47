"""A packed search: up to K sampled points one worker trains together, seed by seed, on one base
model (``harness search --cells-per-worker K``).

The worker asks the sampler for a point as always; :func:`run_search_pack` asks for up to K - 1
more (:func:`harness.sweep.scheduler.trials.ask_search_trial`: never past ``n_trials``; the
sampler sees K running points, as with K workers).  Then, for seed index i = 0, 1, ..., it
trains seed i of every point still live as one pack (:func:`harness.run.packing.run_packed`:
the seed is a base field, and the validation refused a sampled parameter that is one, so the
runs of one seed share a base), and records each point's result as an unpacked search trial
does (:class:`harness.sweep.launching.search_trial.SearchPoint`): the pruner and racing look
after each seed, so a point pruned, raced out, rejected by the config, diverged in every seed,
failed or interrupted ends alone while the others go on to the next seed.  A seed with one
point left trains it unpacked.

Each point stays itself: its own Optuna trial and heartbeat, its own MLflow child run per seed
(tagged ``harness.pack`` with the trial numbers it trained with, as a grid pack's), its own
events, attributes and state; its ``wall_time`` is its runs' own turns and shares of what each
pack set up once.  A stop interrupts every live point of the pack; a full disk or a removed
store stops the worker, which records every point not yet ended as interrupted.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from harness.core.fsutil import fatal_store_error
from harness.sweep.launching.packed import Member, train_pack
from harness.sweep.launching.search_trial import SearchPoint, run_search_trial
from harness.sweep.launching.trial import ClaimedTrial
from harness.sweep.scheduler.trials import ask_search_trial
from harness.sweep.stores.optuna_adapter import heartbeat

if TYPE_CHECKING:
    import optuna

    from harness.run.scaffold import RunResult
    from harness.sweep.scheduler.spec import StudySpec


def ask_search_points(study: optuna.Study, spec: StudySpec, n: int) -> list[optuna.Trial]:
    """Up to ``n`` more points of the search (WAITING retries first), as the budget allows."""
    asked: list[optuna.Trial] = []
    while len(asked) < n:
        trial = ask_search_trial(study, spec)
        if trial is None:
            break
        asked.append(trial)
    return asked


def run_search_pack(first: ClaimedTrial, k: int, pack: list[ClaimedTrial]) -> list[str]:
    """Ask for up to ``k - 1`` more points beside the claimed search trial ``first``, train
    them all seed by seed, packed, and tell Optuna how each ended; returns their outcomes
    (``first``'s first).  Without another point ``first`` trains unpacked
    (``run_search_trial``).  ``pack`` gets every claimed trial as it is claimed, so that the
    worker can record them all as interrupted if the pack stops on a full disk."""
    pack.append(first)
    for trial in ask_search_points(first.study, first.spec, k - 1):
        pack.append(first.sibling(trial))
    if len(pack) == 1:
        return [run_search_trial(first)]
    beats = {id(t): ExitStack() for t in pack}
    try:
        for t in pack:
            beats[id(t)].enter_context(heartbeat(t.study, t.trial, on_error=t.beat_failed))
        points = [SearchPoint(t) for t in pack]
        for p in points:
            p.begin()
        wall = dict.fromkeys(map(id, points), 0.0)
        for i, seed in enumerate(first.spec.seeds):
            live = [p for p in points if p.outcome is None]
            if not live or any(t.fatal is not None for t in pack):
                break
            _train_seed(live, i, seed, pack, wall)
            for p in live:
                if p.outcome is not None:  # ended at this seed: its heartbeat stops
                    beats[id(p.t)].close()
        if any(t.fatal is not None for t in pack):
            return []  # the worker records every point not yet ended as interrupted
    finally:
        for stack in beats.values():
            stack.close()
    return [p.outcome or p.finish(wall[id(p)]) for p in points]


def _train_seed(
    live: list[SearchPoint], i: int, seed: int, pack: list[ClaimedTrial], wall: dict[int, float]
) -> None:
    """Seed ``seed`` (number ``i``) of every live point: packed when two or more have a
    config, else the one left unpacked; each point's result recorded (its ``outcome`` set
    when it ended)."""
    ready = [(p, cfg) for p in live if (cfg := p.config(seed)) is not None]
    if len(ready) == 1:
        p, cfg = ready[0]
        try:
            result, _ = p.t.train(cfg, p.label, seed)
        except Exception as err:
            if fatal_store_error(err) is not None:
                raise  # not this point's fault: the worker stops (worker_loop)
            p.fail(err, seed)
            return
        wall[id(p)] += result.wall_time
        p.record(i, seed, result)
        return
    if not ready:
        return
    by_member: dict[int, SearchPoint] = {}
    members: list[Member] = []
    for p, cfg in ready:
        m = Member(p.t, {}, p.label, seed, cfg=cfg)
        by_member[id(m)] = p
        members.append(m)

    def record(m: Member, result: RunResult) -> str | None:
        p = by_member[id(m)]
        wall[id(p)] += result.wall_time
        if result.status == "failed":  # its error was caught by the pack: it ends alone
            assert m.rid is not None
            return p.failed_run(seed, result.reason, m.rid)
        return p.record(i, seed, result)

    def fail(m: Member, err: BaseException) -> str:
        return by_member[id(m)].fail(err, seed)

    train_pack(members, pack, config=_prebuilt, record=record, fail=fail)


def _prebuilt(m: Member) -> Any:
    return m.cfg

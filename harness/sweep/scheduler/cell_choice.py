"""Which cell ``harness export`` writes: the experiment's cell named by its label or by
``key=value`` pairs (:func:`resolve_cell`), or a finished study's best point
(:func:`best_to_export`).  Writing it in a target's format is
:mod:`harness.sweep.present.cell_export` (with :mod:`harness.peers.export`)."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from harness.config.experiment import ExperimentSpec
from harness.core.configtools import ConfigError, level_str, parse_override
from harness.sweep.scheduler.results import load_study_data
from harness.sweep.scheduler.spec import StudySpec
from harness.sweep.scheduler.study import best_point


def _tokens(text: str) -> dict[str, str]:
    """'eps_clip=0.2 c_clip=3' → {'eps_clip': '0.2', 'c_clip': '3'} with values normalised the way
    cell labels print them (so 3, 3.0 and 3.00 agree)."""
    out = {}
    for tok in text.split():
        key, value = parse_override(tok)
        out[key] = level_str(value)
    return out


def resolve_cell(spec: ExperimentSpec, text: str) -> tuple[str, dict[str, Any]]:
    """The experiment's cell that ``text`` names: its label, or ``key=value`` pairs that pick out
    exactly one cell (short or dotted keys, any order).  Raises ConfigError otherwise."""
    for c in spec.cells:
        if c.label == text.strip():
            return c.label, dict(c.overrides)
    try:
        want = _tokens(text)
    except ConfigError:
        raise ConfigError(
            f"--cell {text!r}: expected the cell's label or KEY=VALUE pairs"
        ) from None
    matches = []
    for c in spec.cells:
        have = _tokens(c.label)
        dotted = {k: v for k, v in have.items()}
        for axis in spec.axes:  # dotted names of each axis are accepted too
            short = next((k for k in have if axis == k or axis.endswith("." + k)), None)
            if short is not None:
                dotted[axis] = have[short]
        if all(dotted.get(k) == v for k, v in want.items()):
            matches.append(c)
    labels = ", ".join(repr(c.label) for c in spec.cells)
    if len(matches) != 1:
        what = "matches no cell" if not matches else f"matches {len(matches)} cells"
        raise ConfigError(f"--cell {text!r} {what} of {spec.name} (cells: {labels})")
    return matches[0].label, dict(matches[0].overrides)


def best_to_export(spec: StudySpec, study: optuna.Study) -> tuple[str, dict[str, Any], list[str]]:
    """(label, overrides, header notes) of a study's best point: a grid's top cell by the
    report's ranking, a search's best trial; the notes give its uncertainty.  ConfigError when
    the study is not finished (a grid) or no run of it completed."""
    trials = study.get_trials(deepcopy=False)
    name = study.study_name
    if spec.kind == "grid":
        runs = load_study_data(study, None).runs
        pending = [r for r in runs if r.status in ("running", "waiting")]
        if pending or not runs:
            raise ConfigError(
                f"--best: study {name!r} is not finished "
                f"({len(runs) - len(pending)} of {len(runs)} runs done)"
            )
    best = best_point(study, spec)
    if best is None:
        states = [t.state for t in trials]
        diverged = sum(
            t.state == TrialState.FAIL and t.user_attrs.get("outcome") == "diverged" for t in trials
        )
        failed = states.count(TrialState.FAIL) - diverged
        raise ConfigError(
            f"--best: no run of study {name!r} completed ({failed} failed, {diverged} "
            f"diverged, {states.count(TrialState.PRUNED)} pruned); nothing to export "
            f"(see `harness report {name}`)"
        )
    what = "top cell by the IQM of" if spec.kind == "grid" else "best trial by the mean of"
    notes = [f"{what} {best.metric}: {best.spread()}"]
    if spec.kind == "search":
        done = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
        notes.append(f"{done} of {spec.expected_trials} search trials finished")
    return best.label, dict(best.overrides), notes

"""Factor effects of a factorial grid: which setting matters, and does it depend on another?

A grid over several axes (factors) answers more than "which cell is best": the main effect of an
axis says how much changing it moves the metric averaged over every setting of the other axes,
and a two-way interaction says how much the effect of one axis changes with another.  With
factor levels indexed by the grid and y(cell, s) the score of seed s in a cell:

    main effect of axis A, level a against the reference level a0, for seed s:
        m_s = mean over the settings c of the other axes of [ y(a, c, s) − y(a0, c, s) ]

    two-way interaction of A (a vs a0) and B (b vs b0), for seed s:
        i_s = mean over the settings c of the remaining axes of
              [ y(a, b, c, s) − y(a0, b, c, s) − y(a, b0, c, s) + y(a0, b0, c, s) ]

    estimate = mean_s m_s (or i_s), interval = paired-t over the seeds:
        mean ± t_{n−1, (1+confidence)/2} · sd_s / √n

This is the treatment-contrast form of the 2^k effects (Montgomery, *Design and Analysis of
Experiments*, ch. 6: an effect is the average difference of the response between a factor's
levels; the AB interaction is half the difference of A's effect at the two levels of B, here
without the half so that it reads as "how much more A moves the metric when B is at b"); the
same definitions are written out in the peer notes J-Ramalho/industRial,
inst/book/docs/doe_advanced.md.  The interval is taken across seeds, not runs: every cell of a
grid runs the same seeds, so a seed's contrast uses the same seed in each cell (paired), and a
t interval on 3-10 per-seed contrasts keeps its coverage where a bootstrap of so few values is
too narrow.  Pure functions: numbers in, numbers out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from harness.report.format import value_str
from harness.report.sequential import paired_interval

if TYPE_CHECKING:
    from harness.report.studydata import CellRow, StudyData

Levels = tuple[Any, ...]  # one level per axis, in axis order


@dataclass(frozen=True)
class Effect:
    """One main effect or two-way interaction, in the metric's units (level − reference)."""

    kind: Literal["main", "interaction"]
    axes: tuple[str, ...]  # (A,) or (A, B)
    levels: tuple[Any, ...]  # (a,) or (a, b)
    reference: tuple[Any, ...]  # (a0,) or (a0, b0)
    estimate: float
    low: float
    high: float
    n_seeds: int

    @property
    def separated(self) -> bool:
        """The interval excludes 0."""
        return self.low > 0 or self.high < 0


def _others(
    axes: Sequence[str], levels: Mapping[str, Sequence[Any]], fixed: Sequence[int]
) -> list[dict[int, Any]]:
    """Every setting of the axes not in ``fixed`` (axis index -> level)."""
    rest = [i for i in range(len(axes)) if i not in fixed]
    return [
        dict(zip(rest, combo, strict=True))
        for combo in itertools.product(*(levels[axes[i]] for i in rest))
    ]


def _cell(y: Mapping[Levels, np.ndarray], n_axes: int, setting: Mapping[int, Any]) -> np.ndarray:
    key = tuple(setting[i] for i in range(n_axes))
    if key not in y:
        raise ValueError(f"not a full factorial: no cell with levels {key}")
    return y[key]


def factor_effects(
    y: Mapping[Levels, Sequence[float]],
    axes: Sequence[str],
    levels: Mapping[str, Sequence[Any]],
    reference: Mapping[str, Any],
    *,
    confidence: float = 0.95,
) -> list[Effect]:
    """Main effects of every axis and two-way interactions of every pair of axes.

    ``y`` maps each cell's levels (one per axis, in ``axes`` order) to its seeds' scores, the
    same seeds in the same order in every cell (NaN-free: pass only seeds every cell scored).
    ``levels[axis]`` lists the axis's levels, ``reference[axis]`` the level the others are
    compared with (the baseline's).  Each non-reference level gets one main effect; each pair
    of non-reference levels of two axes one interaction.  Raises ``ValueError`` when a level
    combination is missing (not a full factorial) or the cells' seed counts differ.
    """
    arrays = {tuple(k): np.asarray(v, dtype=float) for k, v in y.items()}
    sizes = {a.size for a in arrays.values()}
    if len(sizes) != 1:
        raise ValueError(f"every cell needs the same seeds; seed counts {sorted(sizes)}")
    (n,) = sizes
    if any(not np.isfinite(a).all() for a in arrays.values()):
        raise ValueError("scores must be finite (pass the seeds every cell scored)")
    k = len(axes)
    out: list[Effect] = []

    def effect(kind: Any, ax: tuple[str, ...], lv: tuple, ref: tuple, per_seed: np.ndarray):
        est, lo, hi = paired_interval(per_seed.tolist(), confidence) if n else (math.nan,) * 3
        out.append(Effect(kind, ax, lv, ref, est, lo, hi, n))

    for i, axis in enumerate(axes):
        a0 = reference[axis]
        for a in levels[axis]:
            if a == a0:
                continue
            diffs = [
                _cell(arrays, k, {**c, i: a}) - _cell(arrays, k, {**c, i: a0})
                for c in _others(axes, levels, [i])
            ]
            effect("main", (axis,), (a,), (a0,), np.mean(diffs, axis=0))
    for i, j in itertools.combinations(range(k), 2):
        a0, b0 = reference[axes[i]], reference[axes[j]]
        for a in levels[axes[i]]:
            for b in levels[axes[j]]:
                if a == a0 or b == b0:
                    continue
                contrasts = [
                    _cell(arrays, k, {**c, i: a, j: b})
                    - _cell(arrays, k, {**c, i: a0, j: b})
                    - _cell(arrays, k, {**c, i: a, j: b0})
                    + _cell(arrays, k, {**c, i: a0, j: b0})
                    for c in _others(axes, levels, [i, j])
                ]
                effect(
                    "interaction",
                    (axes[i], axes[j]),
                    (a, b),
                    (a0, b0),
                    np.mean(contrasts, axis=0),
                )
    return out


def cell_choices(data: StudyData) -> dict[str, dict[str, str]] | None:
    """Each cell's level of every axis (as text), or None when the study does not say (a
    ``variant`` axis of a study stored before the choices were recorded)."""
    out: dict[str, dict[str, str]] = {}
    for label, overrides in data.cells.items():
        chosen = data.choices.get(label)
        if chosen is None:
            if "variant" in data.axes or any(a not in overrides for a in data.axes):
                return None
            chosen = {a: overrides[a] for a in data.axes}
        if any(a not in chosen for a in data.axes):
            return None
        out[label] = {a: value_str(chosen[a]) for a in data.axes}
    return out


def study_effects(data: StudyData, rows: Sequence[CellRow]) -> tuple[list[Effect], str]:
    """The factor effects of a study's grid on the ranking's run scores, or ([], why not).

    Only a full factorial over two or more axes has them; the seeds used are those every cell
    scored (a diverged run enters with the ranking's imputed score), paired by (task, seed)."""
    axes = list(data.axes)
    if len(axes) < 2:
        return [], "one axis: its effects are the cells' own comparisons in the ranking"
    choices = cell_choices(data)
    if choices is None:
        return [], "the study does not record which level of each axis a cell takes"
    levels = {a: list(dict.fromkeys(value_str(v) for v in data.axes[a])) for a in axes}
    keys = {label: tuple(c[a] for a in axes) for label, c in choices.items()}
    if len(set(keys.values())) != len(keys) or len(keys) != math.prod(map(len, levels.values())):
        return [], "the cells are not one full factorial of the axes"
    by_label = {r.label: r for r in rows}
    per_cell: dict[str, dict[tuple[str, int], float]] = {}
    for label in data.cells:
        runs = data.runs_of(label)
        scores = by_label[label].scores if label in by_label else ()
        per_cell[label] = {
            (r.task, r.seed): v for r, v in zip(runs, scores, strict=True) if math.isfinite(v)
        }
    common = sorted(set.intersection(*(set(v) for v in per_cell.values())))
    if len(common) < 2:
        return [], f"{len(common)} seed(s) scored in every cell: an interval needs 2"
    base = data.baseline if data.baseline in choices else None
    reference = {a: (choices[base][a] if base else levels[a][0]) for a in axes}
    y = {keys[label]: [per_cell[label][s] for s in common] for label in data.cells}
    return factor_effects(y, axes, levels, reference), ""


__all__ = ["Effect", "cell_choices", "factor_effects", "study_effects"]

"""Factor effects of a factorial grid (main effects, two-way interactions, paired-t intervals
across seeds) against a hand-computed 2 x 2 example, and the per-run CSV beside the report."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from harness.report import build_report, ranking
from harness.report.factors import factor_effects, study_effects
from harness.report.studydata import RunData, StudyData

# A in {0, 1} (reference 0), B in {x, y} (reference x), three seeds.
Y = {
    (0, "x"): [1.0, 2.0, 3.0],
    (1, "x"): [2.0, 4.0, 6.0],  # A's effect at x, per seed: 1, 2, 3
    (0, "y"): [1.0, 1.0, 1.0],
    (1, "y"): [3.0, 3.0, 3.0],  # A's effect at y: 2, 2, 2
}
LEVELS = {"A": [0, 1], "B": ["x", "y"]}
REF = {"A": 0, "B": "x"}
T_2 = 4.302652729911275  # t_{2, 0.975}


def test_two_by_two_by_hand() -> None:
    main_a, main_b, inter = factor_effects(Y, ["A", "B"], LEVELS, REF)
    # A per seed: mean(1, 2) = 1.5, mean(2, 2) = 2, mean(3, 2) = 2.5 -> 2, sd 0.5
    assert (main_a.kind, main_a.axes, main_a.levels, main_a.reference) == (
        "main",
        ("A",),
        (1,),
        (0,),
    )
    assert main_a.estimate == pytest.approx(2.0)
    half = T_2 * 0.5 / math.sqrt(3)
    assert (main_a.low, main_a.high) == pytest.approx((2.0 - half, 2.0 + half))
    assert main_a.separated and main_a.n_seeds == 3
    # B per seed: at A=0: 0, -1, -2; at A=1: 1, -1, -3 -> 0.5, -1, -2.5 -> -1, sd 1.5
    assert main_b.levels == ("y",) and main_b.estimate == pytest.approx(-1.0)
    half = T_2 * 1.5 / math.sqrt(3)
    assert (main_b.low, main_b.high) == pytest.approx((-1.0 - half, -1.0 + half))
    assert not main_b.separated
    # A x B per seed: (3 - 1) - (y(1,x) - y(0,x)) = 2 - (1, 2, 3) = 1, 0, -1 -> 0, sd 1
    assert inter.kind == "interaction" and inter.axes == ("A", "B")
    assert inter.levels == (1, "y") and inter.reference == (0, "x")
    assert inter.estimate == pytest.approx(0.0, abs=1e-12)
    assert (inter.low, inter.high) == pytest.approx((-T_2 / math.sqrt(3), T_2 / math.sqrt(3)))


def test_an_inert_third_axis_changes_nothing_and_interacts_with_nothing() -> None:
    y3 = {(a, b, c): v for (a, b), v in Y.items() for c in ("p", "q")}
    effects = factor_effects(y3, ["A", "B", "C"], {**LEVELS, "C": ["p", "q"]}, {**REF, "C": "p"})
    by = {(e.axes, e.levels): e for e in effects}
    assert len(effects) == 3 + 3  # three main effects, three pairs
    assert by[(("A",), (1,))].estimate == pytest.approx(2.0)
    assert by[(("B",), ("y",))].estimate == pytest.approx(-1.0)
    assert by[(("C",), ("q",))].estimate == pytest.approx(0.0, abs=1e-12)
    assert by[(("A", "C"), (1, "q"))].estimate == pytest.approx(0.0, abs=1e-12)


def test_three_levels_give_one_effect_per_non_reference_level() -> None:
    y = dict(Y) | {(2, "x"): [5.0, 5.0, 6.0], (2, "y"): [1.0, 2.0, 2.0]}
    effects = factor_effects(y, ["A", "B"], {"A": [0, 1, 2], "B": ["x", "y"]}, REF)
    by = {(e.axes, e.levels): e for e in effects}
    # A=2 per seed: at x: 4, 3, 3; at y: 0, 1, 1 -> 2, 2, 2
    assert by[(("A",), (2,))].estimate == pytest.approx(2.0)
    # A=2 x B=y per seed: (0, 1, 1) - (4, 3, 3) = -4, -2, -2
    assert by[(("A", "B"), (2, "y"))].estimate == pytest.approx(-8.0 / 3)


def test_not_a_full_factorial_or_unequal_seeds_is_refused() -> None:
    with pytest.raises(ValueError, match="not a full factorial: no cell with levels"):
        factor_effects({k: v for k, v in Y.items() if k != (1, "y")}, ["A", "B"], LEVELS, REF)
    with pytest.raises(ValueError, match="same seeds"):
        factor_effects(Y | {(1, "y"): [3.0, 3.0]}, ["A", "B"], LEVELS, REF)


def grid_study() -> StudyData:
    """The 2 x 2 example as a study: eps_clip x kl_coef, a failed run in one cell."""
    name = {0: "0.2", 1: "0.3"}
    kl = {"x": 0.0, "y": 0.1}
    cells, choices, runs = {}, {}, []
    for (a, b), values in Y.items():
        label = f"eps={name[a]} kl={kl[b]}"
        cells[label] = {"ppo.eps_clip": float(name[a]), "ppo.kl_coef": kl[b]}
        choices[label] = {"ppo.eps_clip": float(name[a]), "ppo.kl_coef": kl[b]}
        for seed, v in enumerate(values):
            runs.append(RunData(label, seed, "completed", summary={"final/reward": v}))
        runs.append(
            RunData(label, 3, "failed", reason="RuntimeError: boom")
            if a and b == "y"
            else RunData(label, 3, "completed", summary={"final/reward": math.nan})
        )
    return StudyData(
        study="grid",
        experiment="grid",
        description="",
        base_config={"steps": 10},
        axes={"ppo.eps_clip": [0.2, 0.3], "ppo.kl_coef": [0.0, 0.1]},
        cells=cells,
        baseline="eps=0.2 kl=0.0",
        metric="final/reward",
        direction="maximize",
        seeds=[0, 1, 2, 3],
        steps=10,
        runs=runs,
        choices=choices,
    )


def test_the_report_has_a_factor_effects_table_and_a_runs_csv(tmp_path: Path) -> None:
    data = grid_study()
    rows = ranking(data, n_boot=200)
    effects, why = study_effects(data, rows)
    assert why == "" and len(effects) == 3
    assert effects[0].estimate == pytest.approx(2.0) and effects[0].n_seeds == 3  # seed 3 unscored
    files = build_report(data, tmp_path, n_boot=200, fit=False)
    md = files.markdown.read_text()
    assert "## Factor effects" in md
    assert "on the 3 seeds every cell scored" in md
    lo, hi = 2.0 - T_2 * 0.5 / math.sqrt(3), 2.0 + T_2 * 0.5 / math.sqrt(3)
    assert (
        f"| `ppo.eps_clip=0.3` | main | ppo.eps_clip=0.2 | +2 [{lo:+.3g}, {hi:+.3g}] | interval excludes 0 |"
        in md
    )
    assert "| `ppo.eps_clip=0.3 × ppo.kl_coef=0.1` | interaction |" in md
    assert files.runs_csv == tmp_path / "runs.csv"
    table = list(csv.DictReader(files.runs_csv.open()))
    assert len(table) == len(data.runs) == 16
    first = table[0]
    assert first["cell"] == "eps=0.2 kl=0.0" and first["ppo.eps_clip"] == "0.2"
    assert first["ppo.kl_coef"] == "0.0" and first["seed"] == "0"
    assert float(first["score"]) == pytest.approx(1.0) and first["status"] == "completed"
    failed = next(r for r in table if r["status"] == "failed")
    assert failed["reason"] == "RuntimeError: boom" and failed["score"] == ""
    assert "[runs.csv](runs.csv)" in md


def test_one_axis_has_no_factor_section(tmp_path: Path) -> None:
    data = grid_study()
    one = StudyData(
        **{**data.__dict__, "axes": {"ppo.eps_clip": [0.2, 0.3]}, "choices": {}}  # type: ignore[arg-type]
    )
    effects, why = study_effects(one, ranking(one, n_boot=50))
    assert effects == [] and why.startswith("one axis")

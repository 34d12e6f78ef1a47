"""What the report shows, kept to what matters: bounded curve fits, the held-fixed keys that can
act, why the winner wins, pass@k and the correction's own statistics where measured, legible
plots for many cells."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from harness.config import build_run_config
from harness.core.configtools import to_dict
from harness.report import fit_curves
from harness.report.configview import held_fixed
from harness.report.studydata import RunData, StudyData
from tests.fixtures import synthetic


def _ramp_study(steps: int = 100) -> StudyData:
    """Rewards in [0, 1] still rising linearly at the end (0 -> 0.5): no ceiling in sight."""
    rng = np.random.default_rng(0)
    runs = []
    for seed in range(3):
        reward = np.linspace(0.0, 0.5, steps) + rng.normal(0, 0.01, steps)
        runs.append(
            RunData(
                "a",
                seed,
                "completed",
                summary={"final/reward": float(reward[-10:].mean())},
                history={"objective/reward": reward.tolist()},
            )
        )
    return StudyData(
        study="ramp",
        experiment="ramp",
        description="",
        base_config={"steps": steps},
        axes={"variant": ["a"]},
        cells={"a": {}},
        baseline="a",
        metric="final/reward",
        direction="maximize",
        seeds=[0, 1, 2],
        steps=steps,
        runs=runs,
    )


def test_a_curve_still_rising_gets_no_ceiling() -> None:
    (row,) = fit_curves(_ramp_study())
    # Unbounded, this curve fits A = 5.5 at half-step 883 for a reward that never passed 0.52.
    logged = max(max(r.history["objective/reward"]) for r in _ramp_study().runs)
    assert not row.fit.ok or (row.fit.at_bound and row.fit.asymptote <= logged)
    assert row.fit.ok or row.fit.reason.endswith("not identified")


def test_a_saturating_curve_is_fitted_within_the_logged_range() -> None:
    study = synthetic.three_cells()
    rows = fit_curves(study)
    seen = [
        v
        for r in study.runs
        if r.status == "completed"
        for v in r.history["objective/reward"]
        if np.isfinite(v)
    ]
    for row in rows:
        assert row.fit.ok, row.fit.reason
        assert min(seen) <= row.fit.asymptote <= max(seen)
        assert 0 < row.fit.half_step <= study.steps


def test_held_fixed_lists_what_can_act() -> None:
    base = to_dict(build_run_config({}))
    study = StudyData(
        study="s",
        experiment="e",
        description="",
        base_config=base,
        axes={"ppo.eps_clip": [0.1, 0.2]},
        cells={"a": {"ppo.eps_clip": 0.1}, "b": {"ppo.eps_clip": 0.2}},
        baseline="a",
        metric="final/reward",
        direction="maximize",
        seeds=[0],
        steps=10,
        runs=[],
    )
    kept, notes = held_fixed(study)
    keys = [k for k, _ in kept]
    assert "ppo.eps_clip" not in keys  # varied
    for inactive in ("ppo.cispo.ratio_max", "ppo.vespo.k_pos", "critic.lr", "eval.k"):
        assert inactive not in keys, inactive
    for active in ("model", "task", "ppo.policy_loss", "rollout.n_samples", "optim.lr"):
        assert active in keys, active
    assert len(keys) < 75
    assert notes[0].startswith(
        f"{_n_inactive_objective_options()} keys: options of the policy losses not used (cispo, clip_cov"
    )
    assert "2 keys: the critic is off" in notes
    # A cell that uses CISPO keeps its options, and a critic in one cell keeps the critic's.
    cells = {"a": {"ppo.policy_loss": "cispo"}, "b": {"critic.enabled": True}}
    kept2, _ = held_fixed(replace(study, cells=cells, axes={"variant": ["a", "b"]}))
    keys2 = [k for k, _ in kept2]
    assert "ppo.cispo.ratio_max" in keys2 and "critic.lr" in keys2
    assert "ppo.vespo.k_pos" not in keys2


def _n_inactive_objective_options() -> int:
    """The options of every objective but the default's (their own ``ppo.<name>.`` blocks)."""
    from harness.core.configtools import flatten
    from harness.ppo.objectives.registry import OBJECTIVES

    keys = flatten(to_dict(build_run_config({})))
    names = [n for n in OBJECTIVES if n != "ppo"]
    return sum(1 for k in keys if any(k.startswith(f"ppo.{n}.") for n in names))


def test_report_held_fixed_section_says_what_it_left_out(tmp_path: Path) -> None:
    from harness.report import build_report

    study = replace(synthetic.three_cells(), base_config=to_dict(build_run_config({})))
    md = build_report(study, tmp_path, n_boot=50, fit=False).markdown.read_text()
    fixed = md.split("## What was held fixed")[1]
    n = _n_inactive_objective_options()
    assert f"Left out as inactive in every cell: {n} keys: options of the policy losses" in fixed
    assert "`ppo.sapo.temperature_pos`" not in fixed
    assert "`optim.lr`" in fixed


@pytest.mark.parametrize("steps", [100])
def test_fit_section_shows_the_reason_not_a_ceiling(steps: int, tmp_path: Path) -> None:
    from harness.report import build_report

    md = build_report(_ramp_study(steps), tmp_path, n_boot=50).markdown.read_text()
    section = md.split("## Saturating curve fits")[1].split("## ")[0]
    assert "not identified" in section or "ceiling held at the edge of the rewards" in section
    assert "| `a` | 5.5" not in section


def test_largest_ratios_by_hand() -> None:
    from harness.report.verdicts import largest_ratios

    winner = {"final KL": 0.05, "clip": 0.0, "entropy": 0.9, "spikes": 0.0, "nan": float("nan")}
    base = {"final KL": 0.01, "clip": 0.07, "entropy": 0.6, "spikes": 0.0, "nan": 1.0}
    got = largest_ratios(winner, base)
    # clip: 0 vs 0.07 (∞), final KL 5×; entropy 1.5× is under 2×; 0 vs 0 and NaN are skipped.
    assert [(n, r) for n, _, _, r in got] == [
        ("clip", float("inf")),
        ("final KL", pytest.approx(5.0)),
    ]


def test_the_conclusion_says_how_the_winner_differs(tmp_path: Path) -> None:
    from harness.report import conclusion, ranking

    study = synthetic.three_cells()
    text = "\n".join(conclusion(ranking(study, n_boot=200), study))
    line = next(s for s in text.splitlines() if s.startswith("How `c_clip=3` differs"))
    # The fixture's winner has a dual-clip fraction and no KL bursts; the baseline the reverse.
    assert re.search(r"dual-clip fraction 0\.0\d+ against 0;", line), line
    assert "KL spikes per run 0 against 1.2" in line  # counts: 6 spikes over 5 runs


def _measured_study() -> StudyData:
    """The 3-cell fixture with a sampled eval, a correction's statistics and the mismatch split
    logged in the cells that would have them (values known per cell and seed)."""
    study = synthetic.three_cells()
    rollout = {**study.base_config["rollout"], "staleness": 1}
    runs = []
    for r in study.runs:
        i = list(study.cells).index(r.cell)
        summary = {
            **r.summary,
            "start/eval_pass_at_1": 0.1,
            "final/eval_pass_at_1": 0.2 + 0.1 * i,
            "start/eval_pass_at_k": 0.3,
            "final/eval_pass_at_k": 0.5 + 0.1 * i,
        }
        h = dict(r.history)
        n = len(h["objective/reward"])
        if r.cell == "c_clip=3":
            h["policy/correction_masked_frac"] = [0.25] * n
            h["policy/behave_weight_max"] = [3.0] * n
        h["mismatch/numerics_kl_k3"] = [1e-4] * n
        h["mismatch/lag_kl_k3"] = [2e-3 * (i + 1)] * n
        runs.append(replace(r, summary=summary, history=h))
    return replace(study, runs=runs, base_config={**study.base_config, "rollout": rollout})


def test_pass_at_k_correction_and_mismatch_split_appear_when_measured(tmp_path: Path) -> None:
    from harness.report import build_report

    md = build_report(_measured_study(), tmp_path, n_boot=50, fit=False).markdown.read_text()
    passk = md.split("## Sampled evaluation: pass@1 and pass@k")[1].split("\n## ")[0]
    assert "| cell | runs | pass@1 start | pass@1 final | pass@k start | pass@k final |" in passk
    assert "| `c_clip=3` | 5 | 0.1 | 0.3 | 0.3 | 0.6 |" in passk
    corr = md.split("## The correction's own statistics")[1].split("\n## ")[0]
    assert "| cell | runs | masked frac | weight max |" in corr
    assert "| `c_clip=3` | 5 | 0.25 | 3 |" in corr and "| `baseline` | 5 | — | — |" in corr
    split = md.split("## Mismatch: numerics and policy lag")[1].split("\n## ")[0]
    assert "| `minibatches=1` | 5 | 0.0001 | 0.006 |" in split
    plain = build_report(synthetic.three_cells(), tmp_path / "plain", n_boot=50, fit=False)
    text = plain.markdown.read_text()
    for section in ("pass@1 and pass@k", "The correction's own", "numerics and policy lag"):
        assert section not in text, section


def test_plots_draw_the_top_cells_and_the_baseline_past_eight_cells(tmp_path: Path) -> None:
    from harness.report import build_report, ranking
    from harness.report.build import MAX_PLOTTED_CELLS, plotted_cells

    base = synthetic.three_cells()
    runs, cells = [], {}
    for k in range(11):  # 33 cells: 11 copies of the fixture's 3, baseline#0 the baseline
        for r in base.runs:
            label = f"{r.cell}#{k}"
            cells[label] = {**base.cells[r.cell], "rollout.n_samples": 4 + k}
            runs.append(replace(r, cell=label))
    big = replace(
        base, cells=cells, runs=runs, baseline="baseline#0", axes={"variant": list(cells)}
    )
    rows = ranking(big, n_boot=50)
    shown = plotted_cells(big, rows)
    assert len(shown) == MAX_PLOTTED_CELLS == 8
    assert "baseline#0" in shown
    assert set(shown) - {"baseline#0"} == {r.label for r in rows[:7]} - {"baseline#0"}
    md = build_report(big, tmp_path, n_boot=50, fit=False).markdown.read_text()
    assert "Only 8 of the 33 cells are drawn (the top of the ranking and the baseline)" in md

"""Start-vs-final comparisons in the report's conclusion (harness/report/progress.py).

The fixture is a hand-written 3-cell study whose run summaries are chosen so that every number
can be checked by hand: one cell improves on every seed, one ends below its start on every seed,
one improves on some seeds and not on others.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.report import build_report, conclusion, ranking
from harness.report import progress as rp
from harness.report.stats import mean_ci
from harness.report.studydata import RunData, StudyData

# cell -> per seed (start/reward, final/reward, start/eval_reward, final/eval_reward)
SUMMARIES = {
    "eps_clip=0.2": [(0.46, 0.60, 0.45, 0.62), (0.50, 0.66, 0.47, 0.64), (0.44, 0.58, 0.43, 0.59)],
    "eps_clip=10": [(0.45, 0.15, 0.44, 0.10), (0.48, 0.20, 0.46, 0.12), (0.47, 0.12, 0.45, 0.05)],
    "eps_clip=0.4": [(0.46, 0.56, 0.45, 0.40), (0.50, 0.44, 0.47, 0.52), (0.44, 0.47, 0.43, 0.46)],
}


def _study(*, with_eval: bool = True, diverged_extra: bool = False) -> StudyData:
    runs = []
    for cell, per_seed in SUMMARIES.items():
        for seed, (s, f, es, ef) in enumerate(per_seed):
            summary = {"start/reward": s, "final/reward": f}
            if with_eval:
                summary |= {"start/eval_reward": es, "final/eval_reward": ef}
            runs.append(RunData(cell, seed, "completed", summary=summary, task="reverse"))
    if diverged_extra:  # a diverged run has no final policy: left out of the comparison
        runs.append(
            RunData(
                "eps_clip=10",
                3,
                "diverged",
                reason="diverged at step 5: x",
                summary={"start/reward": 0.9, "final/reward": 0.0},
                task="reverse",
            )
        )
    return StudyData(
        study="progress",
        experiment="progress",
        description="",
        base_config={"steps": 10, "task": "reverse"},
        axes={"ppo.eps_clip": [0.2, 10.0, 0.4]},
        cells={c: {"ppo.eps_clip": float(c.split("=")[1])} for c in SUMMARIES},
        baseline="eps_clip=0.2",
        metric="final/reward",
        direction="maximize",
        seeds=[0, 1, 2],
        steps=10,
        runs=runs,
    )


def test_numbers_match_a_paired_bootstrap_by_hand() -> None:
    comps = rp.start_vs_final(_study(), "eps_clip=0.2")
    assert [c.what for c in comps] == ["batch reward", "eval reward"]
    batch, ev = comps
    assert batch.n_runs == 3
    assert batch.start == pytest.approx(0.4666667, abs=1e-6)
    assert batch.final.point == pytest.approx(0.6133333, abs=1e-6)
    assert batch.change.point == pytest.approx(0.1466667, abs=1e-6)  # diffs 0.14, 0.16, 0.14
    # the change's CI is the percentile bootstrap of the per-seed differences
    ref = mean_ci(np.array([0.14, 0.16, 0.14]), n_boot=2000, seed=0)
    assert batch.change.low == pytest.approx(ref.low, abs=1e-9)
    assert batch.change.high == pytest.approx(ref.high, abs=1e-9)
    assert 0.14 - 1e-9 <= batch.change.low <= batch.change.high <= 0.16 + 1e-9
    assert batch.verdict == "above"
    assert ev.start == pytest.approx(0.45, abs=1e-9)
    assert ev.final.point == pytest.approx(0.6166667, abs=1e-6)
    assert ev.change.low >= 0.15 - 1e-9 and ev.verdict == "above"


def test_verdicts_above_below_and_overlapping() -> None:
    data = _study()
    assert [c.verdict for c in rp.start_vs_final(data, "eps_clip=10")] == ["below", "below"]
    mixed = rp.start_vs_final(data, "eps_clip=0.4")
    # batch diffs +0.10, −0.06, +0.03 and eval diffs −0.05, +0.05, +0.03: CIs contain 0
    assert [c.verdict for c in mixed] == ["overlaps", "overlaps"]
    assert mixed[0].change.low < 0 < mixed[0].change.high


def test_diverged_runs_and_missing_eval_are_left_out() -> None:
    data = _study(with_eval=False, diverged_extra=True)
    comps = rp.start_vs_final(data, "eps_clip=10")
    assert [c.what for c in comps] == ["batch reward"]  # no eval summaries logged
    assert comps[0].n_runs == 3  # the diverged seed is not counted
    assert comps[0].start == pytest.approx((0.45 + 0.48 + 0.47) / 3, abs=1e-9)


def test_conclusion_states_start_vs_final_per_cell(tmp_path: Path) -> None:
    data = _study()
    rows = ranking(data)
    text = conclusion(rows, data)
    lines = [s for s in text if s.startswith("Start vs final")]
    # one bullet per cell, in ranking order (baseline first: it has the highest final reward)
    assert [ln.split("`")[1] for ln in lines] == [r.label for r in rows]
    assert [r.label for r in rows][0] == "eps_clip=0.2"
    base = lines[0]
    assert "batch reward 0.467 → 0.613 [" in base
    assert "change +0.147 [+0.14, +0.16]: **above the start**" in base
    assert "eval reward 0.45 → 0.617" in base
    worst = next(ln for ln in lines if "`eps_clip=10`" in ln)
    assert worst.count("**below the start**") == 2
    assert "not separated from the start" in next(ln for ln in lines if "`eps_clip=0.4`" in ln)
    md = build_report(data, tmp_path, fit=False).markdown.read_text()
    conclusion_md = md.split("## Conclusion")[1].split("## Warnings")[0]
    assert "Start vs final for `eps_clip=0.2`" in conclusion_md
    header = next(ln for ln in md.splitlines() if ln.startswith("| cell | runs |"))
    assert "start eval reward" in header and "final eval reward" in header


def test_many_cells_show_winner_baseline_and_a_count() -> None:
    data = _study()
    lines = rp.conclusion_lines(
        data, ["eps_clip=0.4", "eps_clip=0.2", "eps_clip=10"], "eps_clip=0.2", max_cells=1
    )
    assert len(lines) == 3
    assert lines[0].startswith("Start vs final for eps_clip=0.4")
    assert lines[1].startswith("Start vs final for eps_clip=0.2")
    assert lines[2] == (
        "Batch reward ends above the start (change CI above 0) in 1 of 3 cells, below it in 1."
    )
    assert rp.conclusion_lines(data, [], None) == []
    assert rp.start_vs_final(data, "no such cell") == []

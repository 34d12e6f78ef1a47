"""The report says only what its decisions support: an adaptive study is ranked and compared on
the seeds each cell shares with the baseline, with the seed rule's verdicts; an interim study
says so at the top and decides nothing the rule has not; cells with 1-2 seeds get no verdict.

The studies are built by hand (one final/reward per run) so every number is known."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.report import build_report, conclusion, ranking, warnings_for
from harness.report.adaptive import adaptive_lines, adaptive_states, interim_reason
from harness.report.prose import MIN_SEEDS_FOR_VERDICT
from harness.report.studydata import RunData, StudyData

BASE = "baseline"
SAME = "same"  # equal to the baseline on its seeds: decided equivalent at 3
CLOSE = "close"  # a little noisy: runs to max, undecided
N_BOOT = 300

# The baseline's first three seeds score low and its last five high, so a cell that stops at
# three seeds looks worse than the baseline when its 3 seeds are set against the baseline's 8.
BASE_SCORES = [0.40, 0.41, 0.42, 0.60, 0.61, 0.62, 0.63, 0.64]
SAME_SCORES = [0.401, 0.409, 0.4205]
CLOSE_SCORES = [0.45, 0.38, 0.47, 0.58, 0.66, 0.60, 0.69, 0.61]


def _study(
    cells: dict[str, list[tuple[str, float]]],
    *,
    adaptive: dict | None = None,
    name: str = "verdicts",
) -> StudyData:
    runs = [
        RunData(
            cell,
            seed,
            status,  # type: ignore[arg-type]
            summary={"final/reward": score} if status == "completed" else {},
            wall_time=2.0,
        )
        for cell, outcomes in cells.items()
        for seed, (status, score) in enumerate(outcomes)
    ]
    return StudyData(
        study=name,
        experiment="exp",
        description="",
        base_config={"steps": 20, "model": "tiny"},
        axes={"variant": list(cells)},
        cells={
            c: ({} if c == BASE else {"ppo.eps_clip": 0.1 * (i + 1)}) for i, c in enumerate(cells)
        },
        baseline=BASE,
        metric="final/reward",
        direction="maximize",
        seeds=list(range(max(len(v) for v in cells.values()))),
        steps=20,
        runs=runs,
        adaptive=adaptive,
    )


PLAN = {"min": 3, "max": 8, "batch": 5, "decide": "baseline", "confidence": 0.95, "margin": 0.05}


def finished_adaptive() -> StudyData:
    done = [("completed", v) for v in BASE_SCORES]
    return _study(
        {
            BASE: done,
            SAME: [("completed", v) for v in SAME_SCORES],
            CLOSE: [("completed", v) for v in CLOSE_SCORES],
        },
        adaptive=PLAN,
    )


def test_adaptive_cells_are_ranked_and_compared_on_the_seeds_they_share(tmp_path: Path) -> None:
    data = finished_adaptive()
    states = adaptive_states(data)
    assert states is not None
    assert states[SAME].status == "equivalent" and states[SAME].decision.n == 3
    assert states[CLOSE].status == "undecided"
    assert interim_reason(data) == ""
    rows = ranking(data, n_boot=N_BOOT)
    by = {r.label: r for r in rows}
    # Paired on seeds 0..2: differences +0.001, -0.001, +0.0005.
    assert by[SAME].n_paired == 3
    assert by[SAME].paired_diff == pytest.approx(0.0005 / 3, abs=1e-12)
    # P(improve) over the 3 pairs' values: 5 of 9 (cell, baseline) value pairs are won.
    assert by[SAME].p_improve is not None
    assert by[SAME].p_improve.point == pytest.approx(5 / 9)
    # Its own 3 seeds against the baseline's 8 would say 1/8 (the unpaired comparison).
    assert by[CLOSE].n_paired == 8
    close_diff = sum(c - b for c, b in zip(CLOSE_SCORES, BASE_SCORES, strict=True)) / 8
    assert by[CLOSE].paired_diff == pytest.approx(close_diff)
    # Ranked by the paired difference (baseline = 0): same (+0.00017) above the baseline.
    assert [r.label for r in rows] == [CLOSE, SAME, BASE]
    warns = " ".join(warnings_for(rows, data))
    assert f"`{SAME}`" not in warns  # decided: no "too few seeds" for it
    text = "\n".join(conclusion(rows, data))
    assert f"`{SAME}`: decided at 3 seeds: equivalent" in text
    assert "(the seed rule's verdict); on those 3 paired seeds it beat the baseline in 56 %" in text
    assert f"`{CLOSE}`: undecided at max (8 seeds)" in text
    assert "**No cell was decided better or worse than the baseline**" in text
    md = build_report(data, tmp_path, n_boot=N_BOOT, fit=False).markdown.read_text()
    assert "paired Δ vs baseline (seeds)" in md
    assert f"| 2 | `{SAME}` | +0.000167 (3) |" in md
    assert "Interim" not in md
    assert "saved 5 seeds" in md  # 3 cells x 8 = 24 against 8 + 3 + 8 = 19


def running_adaptive() -> StudyData:
    """One seed pair finished per cell; the rest of the first look running or held."""
    pending = [("running", 0.0), ("waiting", 0.0)]
    return _study(
        {
            BASE: [("completed", 0.40), *pending],
            SAME: [("completed", 0.90), *pending],
            CLOSE: [("completed", 0.41), *pending],
        },
        adaptive=PLAN,
    )


def test_an_interim_report_says_so_first_and_decides_nothing_the_rule_has_not(
    tmp_path: Path,
) -> None:
    data = running_adaptive()
    assert interim_reason(data) == (
        "6 runs still running or waiting; 3 of 3 cells not yet settled by the seed rule"
    )
    md = build_report(data, tmp_path, n_boot=N_BOOT, fit=False).markdown.read_text()
    head = md.split("## ")[0]  # before the first section
    assert "**Interim report**: the study has not finished" in head
    for claim in ("saved", "Separated from the baseline", "ranks first", "decided at"):
        assert claim not in md, claim
    assert f"`{SAME}` leads so far" in md
    assert f"`{SAME}`: open (no look yet): no verdict yet" in md
    assert "adaptive design so far: 9 seeds released of at most 24" in md
    lines = adaptive_lines(data)
    assert "saved" not in lines[-1]


def test_an_interim_fixed_seed_report_gives_no_verdict(tmp_path: Path) -> None:
    data = _study(
        {
            BASE: [("completed", v) for v in (0.40, 0.41, 0.42)] + [("running", 0.0)],
            SAME: [("completed", v) for v in (0.80, 0.81, 0.82)] + [("waiting", 0.0)],
        }
    )
    text = "\n".join(conclusion(ranking(data, n_boot=N_BOOT), data))
    assert text.startswith("**Interim report**: the study has not finished (2 runs still")
    assert "better than the baseline" not in text and "Separated" not in text
    assert f"`{SAME}` leads so far" in text


@pytest.mark.parametrize("n", [1, 2])
def test_one_or_two_seeds_get_no_verdict(n: int, tmp_path: Path) -> None:
    assert MIN_SEEDS_FOR_VERDICT == 3
    data = _study(
        {
            BASE: [("completed", 0.40 + 0.01 * s) for s in range(n)],
            SAME: [("completed", 0.80 + 0.01 * s) for s in range(n)],
        }
    )
    rows = ranking(data, n_boot=N_BOOT)
    text = "\n".join(conclusion(rows, data))
    assert f"**Sample too small for a verdict** in `{SAME}` ({n}), `{BASE}` ({n})" in text
    for claim in ("**`", "better than the baseline", "Separated", "Nothing separates"):
        assert claim not in text, claim
    assert f"`{SAME}` ranks first by the IQM" in text
    warns = " ".join(warnings_for(rows, data))
    runs = f"{n} scored run{'s' if n != 1 else ''}"
    assert f"**Too few seeds for any verdict** in `{SAME}` ({runs}); `{BASE}` ({runs})" in warns
    assert "Too few seeds for the CI to separate" not in warns
    # Three seeds each: verdicts again.
    data3 = _study(
        {
            BASE: [("completed", 0.40 + 0.01 * s) for s in range(3)],
            SAME: [("completed", 0.80 + 0.01 * s) for s in range(3)],
        }
    )
    text3 = "\n".join(conclusion(ranking(data3, n_boot=N_BOOT), data3))
    assert f"**`{SAME}` ranks first**" in text3
    assert "better than the baseline (CI above 50 %)" in text3


def test_a_decided_worse_cell_under_a_first_ranked_baseline_reads_right(tmp_path: Path) -> None:
    """The default demo's shape: the one cell is decided worse at its first look. The conclusion
    is a sentence, and the empty warnings section claims what the seed rule decided, not a CI
    separation the bootstrap intervals do not show."""
    worse = [0.45, 0.48, 0.47]  # paired differences -0.15, -0.17, -0.18
    data = _study(
        {
            BASE: [("completed", v) for v in (0.60, 0.65, 0.65)],
            "worse": [("completed", v) for v in worse],
        },
        adaptive=PLAN,
    )
    states = adaptive_states(data)
    assert states is not None and states["worse"].status == "worse"
    rows = ranking(data, n_boot=N_BOOT)
    assert warnings_for(rows, data) == []
    text = "\n".join(conclusion(rows, data))
    assert (
        "The baseline ranks first: no cell scores higher than it in `final/reward` on average "
        "over the seeds both ran (mean paired difference)." in text
    )
    md = build_report(data, tmp_path, n_boot=N_BOOT, fit=False).markdown.read_text()
    assert (
        "None: no inert clipping, no diverged or failed runs, no collapses, and every cell is "
        "decided by the seed rule or separates from the baseline." in md
    )
    assert "CI separates" not in md

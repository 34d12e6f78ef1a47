"""The report says only what it knows: no start-vs-final verdict from one or two runs, user text
that reaches the plots and report.md as plain text (no mathtext, no raw HTML), no collapse flag
on a run too short or too low to collapse, and numbers spelled so they cannot be misread (the
seed count, pass@k's k, factor levels as the cells spell them, no "worse by -0.15")."""

from __future__ import annotations

import random
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from markdown_it import MarkdownIt
from matplotlib.text import Text

from harness.config.experiment import cell_label
from harness.core.configtools import level_str
from harness.metrics.stability import summarize_run
from harness.report import build_report, conclusion, ranking, warnings_for
from harness.report import progress as rp
from harness.report.header import seeds_text
from harness.report.plots import plain
from harness.report.render import _Doc, md_safe
from harness.report.scores import MIN_COLLAPSE_PEAK, MIN_COLLAPSE_STEPS, collapse_flag
from harness.report.sections import measured_sections
from harness.report.sequential import Decision
from harness.report.studydata import RunData, StudyData
from tests.report.test_report_contents import _measured_study
from tests.report.test_report_factors import grid_study
from tests.report.test_report_progress import _study as progress_study
from tests.report.test_report_verdicts import PLAN
from tests.report.test_report_verdicts import _study as verdict_study

N_BOOT = 200


def _seeds(data: StudyData, n: int, *, metric: str = "final/eval_reward") -> StudyData:
    """The progress fixture (3 cells, 10 steps) cut to its first ``n`` seeds."""
    return replace(
        data, runs=[r for r in data.runs if r.seed < n], seeds=list(range(n)), metric=metric
    )


# --------------------------------------------------------------------------------------------
# 1. No bold start-vs-final verdict below the report's own minimum of runs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2])
def test_one_or_two_runs_give_no_start_vs_final_verdict(n: int) -> None:
    data = _seeds(progress_study(), n)
    comps = rp.start_vs_final(data, "eps_clip=0.2")
    assert [c.verdict for c in comps] == ["too few", "too few"]
    text = "\n".join(conclusion(ranking(data, n_boot=N_BOOT), data))
    assert "above the start" not in text and "below the start" not in text
    assert "not separated from the start" not in text
    # eps_clip=0.2's eval rewards: 0.45 -> 0.62 (seed 0), 0.47 -> 0.64 (seed 1)
    start, final = (0.45, 0.62) if n == 1 else (0.46, 0.63)
    runs = "1 completed run" if n == 1 else "2 completed runs"
    line = next(s for s in text.splitlines() if s.startswith("Start vs final for `eps_clip=0.2`"))
    assert line.startswith(f"Start vs final for `eps_clip=0.2` (mean over {runs}; a verdict ")
    assert f"eval reward {start:.3g} → {final:.3g}, change +0.17: too few runs to tell" in line
    assert "[" not in line  # no interval that spans only the runs' own values
    # The lead sentence gives the IQM without its zero-width interval.
    assert re.search(
        r"ranks first by the IQM of `final/eval_reward` \(higher is better\): "
        rf"[\d.]+ over {n} scored runs? \(",
        text,
    )


def test_three_runs_give_the_verdict_again() -> None:
    data = _seeds(progress_study(), 3)
    text = "\n".join(conclusion(ranking(data, n_boot=N_BOOT), data))
    assert "eval reward 0.45 → 0.617 [" in text and "**above the start**" in text
    assert "too few runs to tell" not in text


def test_many_cells_count_only_the_cells_with_enough_runs() -> None:
    cells = ["eps_clip=0.4", "eps_clip=0.2", "eps_clip=10"]
    one = rp.conclusion_lines(_seeds(progress_study(), 1), cells, "eps_clip=0.2", max_cells=1)
    assert one[-1] == (
        "No cell has 3 completed runs: too few runs to tell whether the batch reward ends above "
        "the start."
    )
    # Seed 3 of eps_clip=10 diverged: still 3 completed runs there, and in the other two.
    three = rp.conclusion_lines(progress_study(), cells, "eps_clip=0.2", max_cells=1)
    assert three[-1].endswith("in 1 of 3 cells, below it in 1.")


# --------------------------------------------------------------------------------------------
# 2. `$...$` in user text is drawn literally, not parsed as mathtext
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["cost $x^$ here", "a\\$b", "$$", "$5 and $6", "plain"])
def test_plain_text_reaches_matplotlib_unparsed(text: str) -> None:
    shown, math = Text(text=plain(text))._preprocess_math(plain(text))
    assert (shown, math) == (text, False)


def test_a_dollar_in_a_label_or_description_does_not_kill_the_report(tmp_path: Path) -> None:
    bad = "cost $x^$ here"
    data = verdict_study({"baseline": [("completed", 0.4)] * 3, bad: [("completed", 0.5)] * 3})
    data = replace(data, description=f"price {bad}", metric="final/reward")
    files = build_report(data, tmp_path, n_boot=N_BOOT, fit=False)
    assert {p.name for p in files.pngs} == {"intervals.png", "performance_profile.png"}
    assert f"`{bad}`" in files.markdown.read_text()


# --------------------------------------------------------------------------------------------
# 3. No raw HTML in report.md
# --------------------------------------------------------------------------------------------

# What a CommonMark renderer that passes HTML through (markdown-it's commonmark preset, with
# GFM tables) may emit for report.md: the report's own markup and nothing a label brought in.
_OWN_TAGS = {
    "p", "code", "em", "strong", "ul", "li", "ol", "pre", "h1", "h2", "h3", "h4", "h5", "h6",
    "a", "img", "table", "thead", "tbody", "tr", "th", "td", "br", "hr", "blockquote",
}  # fmt: skip
_RENDER = MarkdownIt("commonmark").enable("table")


def _tags(markdown: str) -> set[str]:
    out = _RENDER.render(markdown)
    found = set(re.findall(r"<\s*/?\s*([A-Za-z][\w-]*)", out))
    return found | ({"<!"} if "<!" in out else set()) | ({"<?"} if "<?" in out else set())


@pytest.mark.parametrize(
    ("text", "safe"),
    [
        ("<script>x</script>", "&lt;script>x&lt;/script>"),
        ("entropy < 1, r<1", "entropy < 1, r<1"),  # no tag can start here
        ("`code <b>` <i>", "`code <b>` &lt;i>"),  # code spans are never HTML
        ("`<b>``<script>", "`&lt;b>``&lt;script>"),  # unmatched runs open no span
        ("\\`<script>`", "\\`&lt;script>`"),  # an escaped backtick opens no span
        ("a`\n<script>`", "a`\n&lt;script>`"),  # a line starting with a tag: an HTML block
        ("\\\\<b>", "\\\\&lt;b>"),  # an escaped backslash does not escape the <
        ("<!-- x --> <?p ?> <https://x>", "&lt;!-- x --> &lt;?p ?> &lt;https://x>"),
    ],
)
def test_md_safe_escapes_every_tag_outside_code_spans(text: str, safe: str) -> None:
    assert md_safe(text) == safe
    assert md_safe(safe) == safe
    assert _tags(safe) <= _OWN_TAGS


def test_md_safe_leaves_no_tag_in_random_markdown() -> None:
    rng = random.Random(0)
    pieces = ["<", "b", ">", "`", "``", "\\", "\n", " ", "/", "!", "?", "x", "*", "|", "\n\n"]
    for _ in range(1500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 20)))
        for block in (text, "- " + text):
            assert _tags(md_safe(block)) <= _OWN_TAGS, repr(block)


def test_report_md_carries_no_raw_html(tmp_path: Path) -> None:
    label = "<script>alert(1)</script>"
    data = verdict_study(
        {
            "baseline": [("completed", 0.40), ("completed", 0.41), ("completed", 0.42)],
            label: [("completed", 0.50), ("failed", 0.0), ("completed", 0.52)],
        }
    )
    runs = [
        replace(r, reason="RuntimeError: reward for <img src=x onerror=alert(2)>")
        if r.status == "failed"
        else r
        for r in data.runs
    ]
    data = replace(
        data,
        runs=runs,
        study="s<iframe>",
        description="Compare <b>bold</b>\n<script>alert(3)</script>",
        command="harness ablate x.yaml\n```\n<script>alert(4)</script>",
    )
    md = build_report(data, tmp_path, n_boot=N_BOOT, fit=False).markdown.read_text()
    assert _tags(md) <= _OWN_TAGS
    rendered = _RENDER.render(md)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered  # shown, not run
    assert "&lt;img src=x onerror=alert(2)&gt;" in rendered
    assert "````\nharness ablate x.yaml\n```\n<script>alert(4)</script>\n````" in md


# --------------------------------------------------------------------------------------------
# 4. Smaller things
# --------------------------------------------------------------------------------------------


def _reward_run(cell: str, seed: int, rewards: list[float]) -> RunData:
    h = {"objective/reward": rewards}
    return RunData(cell, seed, "completed", summary=summarize_run(h), history=h)


def test_no_collapse_flag_on_a_run_too_short_or_too_low() -> None:
    assert (MIN_COLLAPSE_STEPS, MIN_COLLAPSE_PEAK) == (10, 0.05)
    short = _reward_run("short", 0, [0.016, 0.010, 0.005])
    low = _reward_run("low", 0, [0.02] * 10 + [0.005] * 20)
    real = _reward_run("real", 0, [0.6] * 10 + [0.1] * 20)
    for r in (short, low, real):
        assert r.summary["stability/collapsed"] == 1.0  # the run-level flag, unsmoothed
    assert np.isnan(collapse_flag(short, 3)) and np.isnan(collapse_flag(low, 30))
    assert collapse_flag(real, 30) == 1.0
    # Without a history the study's steps and the summaries' peak (drop / fraction) stand in.
    bare = replace(short, history={})
    assert np.isnan(collapse_flag(bare, 3)) and np.isnan(collapse_flag(bare, 30))
    assert collapse_flag(replace(real, history={}), 30) == 1.0


def test_a_three_step_run_near_zero_reward_is_not_reported_as_a_collapse(tmp_path: Path) -> None:
    short = _reward_run("short", 0, [0.016, 0.010, 0.005])
    assert short.summary["stability/collapsed"] == 1.0
    data = verdict_study({"baseline": [("completed", 0.4)] * 3, "short": [("completed", 0.5)] * 3})
    data = replace(
        data,
        runs=[
            replace(r, summary={**short.summary, **r.summary}, history=short.history)
            for r in data.runs
        ],
        steps=3,
    )
    rows = ranking(data, n_boot=N_BOOT)
    assert all(np.isnan(r.collapse_rate) and r.n_collapsed == 0 for r in rows)
    assert not any("Collapse" in w for w in warnings_for(rows, data))
    md = build_report(data, tmp_path, n_boot=N_BOOT, fit=False).markdown.read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| 1 | `short` |"))
    assert row.split(" | ")[6] == "—"  # the collapse column: no run can tell


def test_the_seed_count_is_a_count() -> None:
    assert seeds_text([0]) == "1 (seed 0)"
    assert seeds_text([0, 1]) == "2 (seeds 0, 1)"
    assert seeds_text(list(range(10))) == "10 (seeds 0–9)"
    assert seeds_text([0, 1, 2, 5, 7, 8, 9]) == "7 (seeds 0–2, 5, 7–9)"


def test_a_one_seed_report_says_one_seed(tmp_path: Path) -> None:
    data = _seeds(progress_study(), 1)
    md = build_report(data, tmp_path, n_boot=N_BOOT, fit=False).markdown.read_text()
    assert "| seeds | 1 (seed 0) |" in md


def _pass_at_k_section(data: StudyData) -> str:
    doc = _Doc()
    measured_sections(doc, data)
    md = "\n".join(doc.md)
    return md.split("## Sampled evaluation: pass@1 and pass@k")[1].split("\n## ")[0]


def test_the_pass_at_k_table_says_k() -> None:
    data = _measured_study()
    same = replace(data, base_config={**data.base_config, "eval": {"samples": 8, "k": 4}})
    passk = _pass_at_k_section(same)
    assert "pass@1 and pass@k (k = `eval.k` = 4)" in passk
    assert "| cell | runs | pass@1 start | pass@1 final | pass@4 start | pass@4 final |" in passk
    ks = dict(zip(data.cells, (2, 4, 8), strict=True))
    mixed = replace(same, cells={c: {**ov, "eval.k": ks[c]} for c, ov in same.cells.items()})
    passk = _pass_at_k_section(mixed)
    assert "(k = `eval.k`, per cell in the column k)" in passk
    assert (
        "| cell | runs | k | pass@1 start | pass@1 final | pass@k start | pass@k final |" in passk
    )
    assert "| `c_clip=3` | 5 | 4 | 0.1 | 0.3 | 0.3 | 0.6 |" in passk
    # A study that did not record eval.k says so rather than guess.
    assert "(k = `eval.k`, not recorded in this study)" in _pass_at_k_section(data)


@pytest.mark.parametrize(
    "value", [0.0, 0.1, 1e-5, 3.0, 2, True, None, "grpo", {"mean_level": "group", "eps": 0.5}]
)
def test_levels_are_spelled_as_the_cell_labels_spell_them(value: Any) -> None:
    assert cell_label({"ppo.kl_coef": value}, ["ppo.kl_coef"]) == f"kl_coef={level_str(value)}"


def test_factor_effects_spell_levels_as_the_cells_do(tmp_path: Path) -> None:
    md = build_report(grid_study(), tmp_path, n_boot=N_BOOT, fit=False).markdown.read_text()
    effects = md.split("## Factor effects")[1].split("\n## ")[0]
    assert "| `ppo.kl_coef=0.1` | main | ppo.kl_coef=0 |" in effects
    assert "| interaction | ppo.eps_clip=0.2 × ppo.kl_coef=0 |" in effects
    assert "0.0" not in effects


def test_a_decided_worse_cell_reads_lower_by_not_worse_by_minus() -> None:
    d = Decision("worse", 3, -0.1513, -0.2891, -0.01343, 0.95)
    assert d.words() == (
        "decided at 3 seeds: worse, lower by 0.1513 (difference -0.1513 [-0.2891, -0.01343])"
    )
    up = Decision("better", 5, 1.04, 0.93, 1.15, 0.95)
    assert (
        up.words() == "decided at 5 seeds: better, higher by 1.04 (difference +1.04 [+0.93, +1.15])"
    )
    assert (
        Decision("equivalent", 3, 0.001, -0.01, 0.01, 0.95)
        .words()
        .startswith("decided at 3 seeds: equivalent, difference +0.001")
    )


def test_the_adaptive_report_has_no_double_negative(tmp_path: Path) -> None:
    data = verdict_study(
        {
            "baseline": [("completed", v) for v in (0.60, 0.65, 0.65)],
            "worse": [("completed", v) for v in (0.45, 0.48, 0.47)],
        },
        adaptive=PLAN,
    )
    text = "\n".join(conclusion(ranking(data, n_boot=N_BOOT), data))
    assert "`worse`: decided at 3 seeds: worse, lower by 0.1667 (difference -0.1667 [" in text
    assert "by -" not in text
    md = build_report(data, tmp_path, n_boot=N_BOOT, fit=False).markdown.read_text()
    assert "by -" not in md
    assert "3/3 seeds done, decided at 3 seeds: worse, lower by 0.1667 (difference -0.1667" in md

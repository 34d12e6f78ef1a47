"""When trials fail, the harness says why: each distinct reason once with its count on the
console, in `harness status` and in a report that says no run completed; `harness report` and
`export --best` on such a study say so (exit 1 / exit 2).  Plus the small report/status points:
pruned trials apart in `status`, the short-run window caveat, the drawdown smoothing the docs
state, and a search report's best-point spread."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import optuna
import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.core.failures import count_reasons, reason_key, summary_lines
from tests.support.experiments import grid_file, search_file
from tests.support.rewards import FAILING_REWARDS

ROOT = Path(__file__).resolve().parents[3]
SMOKE = ROOT / "experiments" / "smoke.yaml"

TINY = {
    "tiny": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 16},
    "rollout": {"prompts_per_step": 2, "n_samples": 2, "max_new_tokens": 3},
    "ppo": {"ppo_n_minibatches": 2},
    "eval": {"every": 0, "n_prompts": 2},
    "threads": 1,
}


def invoke(args: list[str]) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, args)
    return r.exit_code, r.stdout, r.stderr or ""


def reason_block(err: str, head: str) -> list[str]:
    """The headline line and the indented reason lines under it."""
    lines = err.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(head))
    out = [lines[i]]
    for ln in lines[i + 1 :]:
        if not ln.startswith("  "):
            break
        out.append(ln)
    return out


# ---------------------------------------------------------------------------------------------
# Pure grouping


def test_reasons_differing_only_in_the_reward_call_group_into_one():
    a = "RewardError: task 'python:m:f': f(prompt='8=', completion='j@') raised ZeroDivisionError"
    b = "RewardError: task 'python:m:f': f(prompt=\"it's\", completion='x\\'y') raised ZeroDivisionError"
    c = "RewardError: task 'python:m:g': g(prompt='1=', completion='') returned 'high', not a number"
    assert reason_key(a) == reason_key(b) != reason_key(c)
    assert reason_key(a) == (
        "RewardError: task 'python:m:f': f(prompt=..., completion=...) raised ZeroDivisionError"
    )
    # most frequent first; ties in order of first appearance; blank reasons are named
    assert count_reasons([c, a, b, "", "  "]) == [
        (reason_key(a), 2),
        ("no reason recorded", 2),
        (reason_key(c), 1),
    ]
    lines = summary_lines([a, b, c], 3, finished=0)
    assert lines == [
        "3 of 3 runs failed (no run completed):",
        f"  2 runs: {reason_key(a)}",
        f"  1 run: {reason_key(c)}",
    ]
    assert summary_lines([c], 3, finished=2, what="trial") == [
        "1 of 3 trials failed:",
        f"  1 trial: {reason_key(c)}",
    ]
    assert summary_lines([], 3, finished=3) == []


# ---------------------------------------------------------------------------------------------
# A grid whose every run fails: console, report, `report`, `status`, `export --best`


@pytest.fixture(scope="module")
def failed_grid(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("failed-grid")
    module = tmp / "rewards.py"
    module.write_text(FAILING_REWARDS)
    base = {"task": "reverse", **TINY}
    grid = {"task": [f"python:{module}:raises", f"python:{module}:text"]}
    exp = grid_file(tmp / "allfail.yaml", "allfail", base, grid, seeds=2, metric="final/reward")
    results = tmp / "results"
    code, out, err = invoke(["ablate", str(exp), "--results-dir", str(results)])
    return exp, results, code, out, err


RAISED = "raised ZeroDivisionError: division by zero"
RETURNED = "returned 'high', not a number"


def test_all_failed_sweep_prints_each_reason_once_and_writes_a_report(failed_grid):
    exp, results, code, out, err = failed_grid
    assert code == 1 and "Traceback" not in out + err
    block = reason_block(err, "4 of 4 runs failed")
    assert block[0] == "4 of 4 runs failed (no run completed):"
    assert len(block) == 3, block  # two distinct reasons, each once
    assert sorted(ln.split(":")[0] for ln in block[1:]) == ["  2 runs", "  2 runs"]
    assert sum(RAISED in ln for ln in block) == 1 and sum(RETURNED in ln for ln in block) == 1
    assert all("(prompt=..., completion=...)" in ln for ln in block[1:])
    md = (results / "allfail" / "report.md").read_text()
    assert "**No run completed**: of 4 runs, 4 failed, 0 diverged and 0 have not finished" in md
    conclusion = md.split("## Conclusion", 1)[1].split("## Warnings", 1)[0]
    assert conclusion.count("2 runs: `RewardError") == 2
    assert RAISED in conclusion and RETURNED in conclusion
    assert (results / "allfail" / "report.html").is_file()


def test_report_on_a_study_with_no_completed_run_says_so_and_exits_1(failed_grid):
    exp, results, *_ = failed_grid
    md = results / "allfail" / "report.md"
    md.unlink()
    code, out, err = invoke(["report", "allfail", "--results-dir", str(results)])
    assert code == 1 and "Traceback" not in out + err
    assert err.strip().splitlines()[-1] == "study 'allfail': no run completed"
    assert len(reason_block(err, "4 of 4 runs failed")) == 3
    assert "**No run completed**" in md.read_text()


def test_status_lists_the_reasons_and_counts(failed_grid):
    exp, results, *_ = failed_grid
    code, out, err = invoke(["status", "allfail", "--results-dir", str(results)])
    assert code == 0, err
    row = next(ln for ln in out.splitlines() if "allfail" in ln and "│" in ln)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells == ["allfail", "0", "0", "0", "0", "0", "4", "4"]
    block = reason_block(out, "allfail: why trials failed")
    assert len(block) == 3 and all(ln.startswith("  2 trials: RewardError") for ln in block[1:])


def test_export_best_of_a_study_with_no_completed_run_is_one_line_exit_2(failed_grid):
    exp, results, *_ = failed_grid
    code, out, err = invoke(
        ["export", str(exp), "--best", "--to", "verl", "--results-dir", str(results)]
    )
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, (code, out, err)
    assert lines[0] == (
        "error: --best: no run of study 'allfail' completed (4 failed, 0 diverged, 0 pruned); "
        "nothing to export (see `harness report allfail`)"
    )


# ---------------------------------------------------------------------------------------------
# A search whose trial fails: it stops at the error (no point sampled after it) and says why


@pytest.mark.slow  # long multi-process run; CI's slow suite runs it
def test_all_failed_search_stops_reports_and_exits_1(tmp_path):
    module = tmp_path / "rewards.py"
    module.write_text(FAILING_REWARDS)
    exp = search_file(tmp_path, "searchfail", {"task": f"python:{module}:raises", **TINY})
    results = tmp_path / "results"
    code, out, err = invoke(["search", str(exp), "--results-dir", str(results)])
    assert code == 1 and "Traceback" not in out + err
    block = reason_block(err, "1 of 2 trials failed")
    assert block[0] == "1 of 2 trials failed (no trial completed):"
    assert len(block) == 2 and block[1].startswith("  1 trial: RewardError") and RAISED in block[1]
    from harness.sweep.stores.storage import make_storage

    study = optuna.load_study(study_name="searchfail", storage=make_storage(None, results))
    assert [t.state.name for t in study.trials] == ["FAIL"]  # a bug is not retried at new points
    md = (results / "searchfail" / "report.md").read_text()
    assert "**No trial completed** (1 failed of 1 run so far)" in md
    assert "## Why trials failed" in md and RAISED in md
    code, out, err = invoke(["report", "searchfail", "--results-dir", str(results)])
    assert code == 1 and "no run completed" in err


# ---------------------------------------------------------------------------------------------
# `status`: pruned trials are not "done"


def _search_study(storage, name: str, states: list[str]) -> None:
    from harness.config.experiment import load_experiment
    from harness.sweep.scheduler.spec import SPEC_ATTR, StudySpec

    doc = yaml.safe_load(SMOKE.read_text())
    doc.pop("grid"), doc.pop("baseline")
    doc.update(
        name=name,
        search={
            "n_trials": 5,
            "params": {"ppo.eps_clip": {"type": "float", "low": 0.1, "high": 0.3}},
        },
    )
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "s.yaml"
        f.write_text(yaml.safe_dump(doc))
        spec = StudySpec.from_experiment(load_experiment(f))
    study = optuna.create_study(study_name=name, storage=storage)
    study.set_user_attr(SPEC_ATTR, spec.to_json())
    for i, state in enumerate(states):
        t = study.ask()
        if state == "COMPLETE":
            study.tell(t, 0.1 * i)
        elif state == "PRUNED":
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
        else:
            t.set_user_attr("outcome", "error")
            t.set_user_attr("reason", f"ValueError: bad point {i}")
            study.tell(t, state=optuna.trial.TrialState.FAIL)


def test_status_counts_pruned_trials_apart_from_done(tmp_path, capsys):
    from harness.sweep.present.display import print_status
    from harness.sweep.stores.storage import make_storage

    storage = make_storage(None, tmp_path)
    _search_study(storage, "pr", ["COMPLETE", "PRUNED", "PRUNED", "FAIL"])
    print_status(storage, None)
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if "│ pr" in ln)
    assert [c.strip() for c in row.split("│")[1:-1]] == ["pr", "1", "2", "0", "0", "0", "1", "5"]
    assert "  1 trial: ValueError: bad point 3" in out


# ---------------------------------------------------------------------------------------------
# Report details


def _study_data(steps: int, start: list[float], final: list[float]):
    from harness.report.studydata import RunData, StudyData

    runs = [
        RunData(
            cell="c",
            seed=i,
            status="completed",
            summary={"start/reward": s, "final/reward": f, "start/eval_reward": s},
        )
        for i, (s, f) in enumerate(zip(start, final, strict=True))
    ]
    for r in runs:
        r.summary["final/eval_reward"] = r.summary["final/reward"]
    return StudyData(
        study="s",
        experiment="s",
        description="",
        base_config={},
        axes={"x": [1]},
        cells={"c": {"x": 1}},
        baseline=None,
        metric="final/reward",
        direction="maximize",
        seeds=list(range(len(runs))),
        steps=steps,
        runs=runs,
    )


@pytest.mark.parametrize(
    ("steps", "expect"),
    [
        (5, "with 5 steps the start and final windows are the same 5 steps"),
        (15, "share 5 steps, so this change understates any learning"),
        (20, None),
    ],
)
def test_short_runs_carry_a_window_caveat_on_the_batch_reward_change(steps, expect):
    from harness.report import progress as rp

    same = [0.4, 0.5, 0.6]
    data = _study_data(steps, same, same)
    (line,) = rp.conclusion_lines(data, ["c"], None, n_boot=200)
    batch, evalpart = line.split("; eval reward", 1)
    assert "change +0 [+0, +0]" in batch
    if expect is None:
        assert "caveat" not in line
    else:
        assert "(*caveat*: with " in batch and expect in batch and "caveat" not in evalpart


def test_drawdown_smoothing_in_the_docs_is_the_one_runs_use(tmp_path):
    import numpy as np

    from harness.config import build_run_config
    from harness.metrics.stability import RUN_SMOOTH, summarize_run
    from harness.run.loop import run

    doc = (ROOT / "docs" / "stability.md").read_text()
    row = next(ln for ln in doc.splitlines() if ln.startswith("| `stability/max_drawdown` |"))
    assert f"uses `smooth={RUN_SMOOTH}`" in row and "with the default `smooth=1`" not in row
    res = run(build_run_config({"steps": 8, **TINY}), results_dir=tmp_path)
    rewards = np.asarray(res.history["objective/reward"], dtype=float)
    want = summarize_run({"objective/reward": rewards}, smooth=RUN_SMOOTH)
    got = res.summary["stability/max_drawdown"]
    assert math.isclose(got, want["stability/max_drawdown"], rel_tol=1e-9, abs_tol=1e-12)


def test_search_report_shows_the_best_points_seed_spread(tmp_path):
    from harness.config.experiment import load_experiment
    from harness.sweep.present.finish import write_search_report
    from harness.sweep.scheduler.spec import StudySpec
    from harness.sweep.scheduler.study import seed_spread

    doc = yaml.safe_load(SMOKE.read_text())
    doc.pop("grid"), doc.pop("baseline")
    doc.update(
        name="spread",
        seeds=3,
        search={
            "n_trials": 2,
            "params": {"ppo.eps_clip": {"type": "float", "low": 0.1, "high": 0.3}},
        },
    )
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(doc))
    spec = StudySpec.from_experiment(load_experiment(f))
    study = optuna.create_study(direction="maximize")
    for values in ([0.2, 0.4, 0.9], [0.1, 0.2, 0.3]):
        t = study.ask()
        t.suggest_float("ppo.eps_clip", 0.1, 0.3)
        t.set_user_attr("seed_values", [values])
        t.set_user_attr("seeds_run", 3)
        study.tell(t, sum(values) / 3)
    path = write_search_report(study, spec, [study.best_trial], tmp_path / "out")
    text = path.read_text()
    m = re.search(
        r"Trial 0, seed by seed: `final/reward` mean 0\.5, 95 % bootstrap CI \[([\d.]+), ([\d.]+)\] "
        r"over 3 seeds \(min 0\.2, max 0\.9\)",
        text,
    )
    assert m, text
    low, high = float(m.group(1)), float(m.group(2))
    assert 0.2 <= low < 0.5 < high <= 0.9
    assert seed_spread([0.7]) == "value 0.7 from 1 seed: no spread (run more seeds for a CI)"
    assert json.loads(json.dumps(study.best_trial.user_attrs["seed_values"])) == [[0.2, 0.4, 0.9]]

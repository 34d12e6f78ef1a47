"""What a sweep prints stays readable: a run's warning once per cell without a source path, a
progress line not cut at 80 columns when stderr is a log file, and an unknown reasoning-gym
generator answered with close names rather than the whole list."""

from __future__ import annotations

import io
import warnings

import pytest
from rich.console import Console

from harness.sweep.present.progress import SweepProgress

INERT = "clipping is inert in this configuration (...)"


def test_a_runs_warning_is_printed_once_per_cell_without_a_path():
    out = io.StringIO()
    progress = SweepProgress(2, total=6, done=0, console=Console(file=out, width=200))
    for seed in range(3):  # three seeds of one cell, from two workers
        progress.handle(
            {
                "event": "warning",
                "worker": seed % 2,
                "cell": "eps_0.3",
                "seed": seed,
                "message": INERT,
            }
        )
    progress.handle({"event": "warning", "worker": 0, "cell": "eps_0.1", "message": INERT})
    progress.handle({"event": "warning", "worker": 0, "cell": "eps_0.1", "message": "other"})
    lines = [ln for ln in out.getvalue().splitlines() if "warning:" in ln]
    assert lines == [
        f"eps_0.3: warning: {INERT}",
        f"eps_0.1: warning: {INERT}",
        "eps_0.1: warning: other",
    ]
    assert not any(".py" in ln for ln in lines)


def test_progress_to_a_log_file_is_not_cut_at_80_columns():
    progress = SweepProgress(1, total=1, done=0)  # stderr is captured here: not a terminal
    assert not progress.console.is_terminal
    assert progress.console.width == 200


def test_the_worker_forwards_each_warning_of_a_run_as_an_event(monkeypatch):
    from harness.sweep.launching import trial as claimed

    events: list[dict] = []

    class _Opts:
        worker_id, results_dir = 0, "results"

    study = type("Study", (), {"study_name": "s"})()
    trial = type("Trial", (), {"number": 7})()
    spec = type("Spec", (), {"experiment": "e", "parent_run_id": None})()
    t = claimed.ClaimedTrial(study, trial, spec, None, _Opts(), events.append, lambda: False)
    monkeypatch.setattr(claimed, "child_run_tags", lambda *a: {})

    def fake_run(cfg, tracker, **kw):
        warnings.warn(INERT, UserWarning, stacklevel=1)
        return "result", "rid"

    import harness.run.tracked as tracked

    monkeypatch.setattr(tracked, "tracked_run", fake_run)
    cfg = type("C", (), {"steps": 3})()
    assert t.train(cfg, "eps_0.3", 1) == ("result", "rid")
    warned = [e for e in events if e["event"] == "warning"]
    assert [(e["cell"], e["seed"], e["message"]) for e in warned] == [("eps_0.3", 1, INERT)]


def test_an_unknown_generator_names_close_matches_not_all():
    pytest.importorskip("reasoning_gym")
    from harness.tasks import get_task

    with pytest.raises(ValueError) as err:
        get_task("rg:countdwn")
    msg = str(err.value)
    assert "did you mean countdown" in msg and len(msg) < 300, msg

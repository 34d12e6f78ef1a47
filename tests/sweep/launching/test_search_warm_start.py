"""A search and a diverging warm start: where the search varies the warm start's own settings, a
point whose warm start diverges cannot train and is rejected (PRUNED, with the reason) while the
search goes on; where every point shares one warm start, the first point's failure stops the
search as any error does (each new point would fail the same way)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.sweep.stores.storage import make_storage
from tests.support.experiments import search_file, smoke_base

DIVERGED = "WarmStartDiverged: warm_start: the supervised warm start diverged (its loss was nan"


def _search(tmp_path: Path, name: str, **search: object) -> tuple[int, str, list]:
    tmp_path.mkdir()
    base = {**smoke_base(), "warm_start": {"steps": 8, "batch_size": 4, "lr": 1.0e30}}
    exp = search_file(tmp_path, name, base, steps=1, **search)  # type: ignore[arg-type]
    results = tmp_path / "results"
    r = CliRunner().invoke(app, ["search", str(exp), "--results-dir", str(results)])
    study = optuna.load_study(study_name=name, storage=make_storage(None, results))
    return r.exit_code, r.output, study.trials


@pytest.mark.slow  # two searches, a few runs each
def test_a_point_whose_warm_start_diverges_is_rejected_and_the_search_goes_on(tmp_path):
    lrs = {"warm_start.lr": {"type": "categorical", "choices": [1.0e30, 1.0e-3]}}
    code, out, trials = _search(tmp_path / "a", "wslr", n_trials=5, params=lrs)
    assert code == 0, out
    assert len(trials) == 5
    by_lr: dict[float, set[str]] = {}
    for t in trials:
        by_lr.setdefault(t.params["warm_start.lr"], set()).add(t.state.name)
        if t.params["warm_start.lr"] == 1.0e30:
            assert t.user_attrs["outcome"] == "pruned"
            assert t.user_attrs["reason"].startswith(f"the point cannot train: {DIVERGED}")
    assert by_lr == {1.0e30: {"PRUNED"}, 1.0e-3: {"COMPLETE"}}, by_lr  # the seed draws both

    code, out, trials = _search(tmp_path / "b", "wsfixed", n_trials=3)
    assert code == 1, out
    assert [t.state.name for t in trials] == ["FAIL"]  # not retried at new points
    assert trials[0].user_attrs["outcome"] == "error"
    assert trials[0].user_attrs["reason"].startswith(DIVERGED)

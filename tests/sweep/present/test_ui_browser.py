"""The UIs seen in a real browser (headless Chromium): the MLflow view `harness ui` prints shows
the runs grouped by cell with the metric as a column (not MLflow's GenAI view), its chart view
compares the cells, and optuna-dashboard's study page shows the trials' params.

Skipped when Chromium is not installed (Debian: ``apt-get install chromium``). With
``HARNESS_UI_SCREENSHOTS=DIR`` the screenshots are kept in DIR (``results/ui/`` holds the
committed ones).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.support.cdp import Browser, find_chromium
from tests.support.ui_servers import Served, get

CHROMIUM = find_chromium()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed"),
]


def keep(shot: Path) -> None:
    target = os.environ.get("HARNESS_UI_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(target) / shot.name)


def printed_url(served: Served) -> str:  # noqa: F811
    match = re.search(r"mlflow: (http://\S+viewStateShareKey=\S+)\s+\(smoke\)", served.output())
    assert match, served.output()
    return match.group(1)


def test_mlflow_view_groups_runs_by_cell(served: Served, tmp_path):  # noqa: F811
    url = printed_url(served)
    assert CHROMIUM is not None
    with Browser(CHROMIUM) as browser:
        browser.goto(url)
        text = browser.wait_for_text(
            "Group: c_clip=3", "Group: c_clip=none", "final/reward", "4 matching runs"
        )
        assert "Model training" in text and "Traces / Latency" not in text
        assert "Group by: ablation.cell" in text
        shot = tmp_path / "mlflow_runs_grouped_by_cell.png"
        browser.screenshot(shot)
        keep(shot)

        browser.goto(url + "&compareRunsMode=CHART")
        # chart sections are named after the metric prefixes (objective/..., final/...)
        browser.wait_for_text("Group: c_clip=3", "Add chart", "objective", "final")
        browser.evaluate(
            "[...document.querySelectorAll('span,div,h3')]"
            ".find(e => e.childElementCount === 0 && e.textContent.trim() === 'objective')"
            "?.scrollIntoView()"
        )
        time.sleep(6)  # let the charts draw before the picture is taken
        shot = tmp_path / "mlflow_charts_by_cell.png"
        browser.screenshot(shot)
        keep(shot)

        # run-level summaries (final/*) are single values: one bar per cell
        browser.evaluate(
            "[...document.querySelectorAll('span,div,h3')]"
            ".find(e => e.childElementCount === 0 && e.textContent.trim() === 'final')"
            "?.scrollIntoView()"
        )
        time.sleep(6)
        shot = tmp_path / "mlflow_summary_bars_by_cell.png"
        browser.screenshot(shot)
        keep(shot)


def test_optuna_dashboard_study_page_shows_params(served: Served, tmp_path):  # noqa: F811
    studies = get(f"{served.dashboard}/api/studies")["study_summaries"]
    study_id = next(s["study_id"] for s in studies if s["study_name"] == "smoke")
    assert CHROMIUM is not None
    with Browser(CHROMIUM, height=1400) as browser:
        browser.goto(f"{served.dashboard}/dashboard/studies/{study_id}")
        text = browser.wait_for_text("final/reward", "ppo.c_clip", "seed")
        assert "Objective 0" not in text
        time.sleep(3)
        shot = tmp_path / "optuna_dashboard_study.png"
        browser.screenshot(shot)
        keep(shot)

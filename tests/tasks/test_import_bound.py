"""A ``python:`` task module whose import waits is refused with one line once the bound passes
(the reward process bounds its own import of it the same way), in the harness process too,
where nothing bounded it: ``harness run`` waited silently for as long as the import did."""

from __future__ import annotations

import time

import pytest

import harness.tasks.sources.python as python_source
from harness.tasks import get_task
from tests.support.cli import invoke_run
from tests.support.tiny import FAST_RUN

SLEEPY = """
import time

try:
    time.sleep({seconds})  # e.g. a server the module waits for
except Exception:
    pass  # module code that swallows errors around its waits must not defeat the bound


def examples():
    return [{{"prompt": f"{{i}}=", "answer": str(i)}} for i in range(20)]


def score(prompt, completion, answer):
    return 0.0
"""


@pytest.fixture
def sleepy(tmp_path, monkeypatch):
    # The import would take 30 s; the bound is moved to 1 s (a test without the bound fails on
    # the missing error after 30 s instead of hanging).
    module = tmp_path / "sleepy.py"
    module.write_text(SLEEPY.format(seconds=30))
    monkeypatch.setattr(python_source, "START_TIMEOUT_S", 1.0)
    return module


def test_an_import_that_waits_past_the_bound_is_refused(sleepy):
    t0 = time.monotonic()
    with pytest.raises(ValueError) as err:
        get_task(f"python:{sleepy}:score")
    assert str(err.value) == (
        f"task 'python:{sleepy}:score': importing '{sleepy}' did not finish within 1 s (its "
        "module-level code runs in every process that builds the task: it must not wait)"
    )
    assert time.monotonic() - t0 < 20


def test_harness_run_refuses_it_with_one_line_and_exit_2(sleepy, tmp_path):
    results = tmp_path / "results"
    r = invoke_run(results, *FAST_RUN, f"task=python:{sleepy}:score")
    assert r.exit_code == 2, r.output
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: task 'python:{sleepy}:score': importing '{sleepy}' did not")
    assert not results.exists() or not (results / "mlflow.db").exists()


def test_an_import_within_the_bound_still_builds_the_task(tmp_path, monkeypatch):
    module = tmp_path / "brief.py"
    module.write_text(SLEEPY.format(seconds=0.1))
    monkeypatch.setattr(python_source, "START_TIMEOUT_S", 30.0)
    task = get_task(f"python:{module}:score")
    try:
        assert len(task.train) + len(task.eval_examples(100)) == 20
    finally:
        task.close()

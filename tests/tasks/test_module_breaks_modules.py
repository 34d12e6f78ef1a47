"""A ``python:`` task module whose import breaks ``sys.modules`` (deletes the harness's entries,
sets ``sys.modules['os'] = None``), exits or raises a many-line error is one line naming the task
and what it did: exit 2 before anything is written when the config is validated, a FAILED run
when the run's own import meets it.  It gave a 50-line traceback from the harness's next import,
far from the cause, and the harness process was left with the broken modules."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.tasks import get_task
from tests.support.tiny import FAST_RUN, set_flags
from tests.tasks.test_reward_lifecycle import _args, _runs

TAIL = """

def examples():
    return [{"prompt": f"{i}=", "answer": str(i)} for i in range(20)]


def score(prompt, completion, answer):
    return 1.0
"""

BREAKERS = {
    "os_none": ("import sys\nsys.modules['os'] = None\n", "set sys.modules['os'] to None"),
    "deletes_harness": (
        "import sys\nfor k in [k for k in sys.modules if k.split('.')[0] == 'harness']:\n"
        "    del sys.modules[k]\n",
        "deleted sys.modules['harness'] (and ",
    ),
    "replaces_json": (
        "import sys, types\nsys.modules['json'] = types.ModuleType('json')\n",
        "replaced sys.modules['json']",
    ),
    "clears": ("import sys\nsys.modules.clear()\n", "deleted sys.modules["),
    "exits": ("import sys\nsys.exit(3)\n", "called sys.exit(3)"),
    "raises": (
        "raise ValueError('first line\\nsecond line')\n",
        "cannot import module '{module}' (ValueError: first line)",
    ),
}


def _write(tmp_path: Path, name: str) -> tuple[Path, str]:
    head, expect = BREAKERS[name]
    module = tmp_path / f"{name}.py"
    module.write_text(head + TAIL)
    return module, expect.format(module=module)


def _intact() -> None:
    """The test process's own modules are as they were (CliRunner runs the CLI in it)."""
    assert sys.modules.get("os") is os and sys.modules.get("json") is json
    assert "harness.cli" in sys.modules and "harness.tasks.base" in sys.modules


@pytest.mark.parametrize("name", list(BREAKERS))
def test_harness_run_refuses_the_module_with_one_line(tmp_path, name, assert_one_line_error):
    module, expect = _write(tmp_path, name)
    results = tmp_path / "results"
    args = ["run", *set_flags(*FAST_RUN, f"task=python:{module}:score")]
    r = CliRunner().invoke(app, [*args, "--results-dir", str(results)])
    _intact()
    assert_one_line_error(r, f"error: task 'python:{module}:score': ")
    assert expect in r.stderr, r.stderr
    assert not results.exists() or not any(results.iterdir())


def test_harness_ablate_refuses_it_before_writing_anything(tmp_path, assert_one_line_error):
    module, expect = _write(tmp_path, "os_none")
    exp = tmp_path / "exp.yaml"
    base = {"task": f"python:{module}:score", "steps": 1}
    exp.write_text(json.dumps({"name": "broken", "base": base, "grid": {"ppo.eps_clip": [0.2]}}))
    results = tmp_path / "results"
    r = CliRunner().invoke(app, ["ablate", str(exp), "--results-dir", str(results)])
    _intact()
    assert_one_line_error(r, expect)
    assert not results.exists() or not any(results.iterdir())


SECOND_IMPORT = """
import os, sys

MARK = {mark!r}
if os.path.exists(MARK):  # the run's own import, after the config's was fine
    sys.modules["json"] = None
else:
    open(MARK, "w").close()
"""


def test_a_module_that_breaks_them_on_the_runs_own_import_fails_the_run_in_one_line(tmp_path):
    module = tmp_path / "second.py"
    module.write_text(SECOND_IMPORT.format(mark=str(tmp_path / "imported")) + TAIL)
    results = tmp_path / "results"
    r = CliRunner().invoke(app, _args(module, "score", results))
    _intact()
    assert r.exit_code == 1, r.output[-3000:]
    assert "Traceback" not in r.output
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    why = f"task 'python:{module}:score': importing '{module}' set sys.modules['json'] to None"
    assert err[-1].startswith(f"error: run FAILED: {why}; a task module must leave"), err[-3:]
    (run,) = _runs(results)
    assert run.info.status == "FAILED"
    assert why in run.data.tags["run.reason"]


def test_a_module_that_only_adds_modules_builds(tmp_path):
    module = tmp_path / "adds.py"
    # A new None entry blocks an import the module does not want; no module was loaded there.
    module.write_text("import fractions, sys\nsys.modules['harness_test_blocked'] = None\n" + TAIL)
    try:
        task = get_task(f"python:{module}:score")
        task.close()
    finally:
        sys.modules.pop("harness_test_blocked", None)
    assert len(task.train) + len(task.eval_examples(100)) == 20

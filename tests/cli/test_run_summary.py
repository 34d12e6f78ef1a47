"""`harness run`'s closing summary says which sampler made the rollouts, resolved (an `auto`
decoder names the one it took), and the run's tags record the same."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from harness import tracking
from harness.cli import app
from harness.tracking import MemoryTracker
from tests.support.tiny import FAST_RUN


@pytest.mark.parametrize(
    ("sets", "said"),
    [
        ([], "local, fast decoder"),  # auto on the tiny Llama takes the fast decoder
        (["rollout.sampler_backend=hf"], "local, HF generate decoder"),
        (
            ["rollout.sampler_dtype=bfloat16", "rollout.sampler_logit_noise=0.5"],
            "local, fast decoder (bfloat16; learner float32), logit noise 0.5",
        ),
        (
            ["rollout.async.max_staleness=2", "rollout.async.weight_updates=in_flight"],
            "local, fast decoder; async η 2, in-flight (KV kept), virtual clock",
        ),
    ],
    ids=["auto", "hf", "bf16-noise", "async"],
)
def test_the_summary_names_the_sampler_that_ran(sets, said, tmp_path, monkeypatch):
    tracker = MemoryTracker()
    monkeypatch.setattr(tracking, "open_tracker", lambda uri, results_dir: tracker)
    args = ["run", *[a for s in [*FAST_RUN, *sets] for a in ("--set", s)]]
    r = CliRunner().invoke(app, [*args, "--results-dir", str(tmp_path / "results")])
    assert r.exit_code == 0, r.output
    (run,) = tracker.runs.values()
    assert run.tags["sampler"] == said
    row = next(line for line in r.output.splitlines() if line.strip("│ ").startswith("sampler"))
    assert said.split(" (")[0].split(";")[0] in row
